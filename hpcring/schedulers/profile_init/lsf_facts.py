"""IBM Spectrum LSF: `bqueues`, a table headed `QUEUE_NAME PRIO STATUS MAX ...` with one queue per line. It
names the queues but not their run limits (those are in `bqueues -l`), so walltimes stay placeholders."""

from __future__ import annotations


def queue_names(text: str) -> list[str]:
    lines = [ln.split() for ln in text.splitlines() if ln.strip()]
    if not lines or lines[0][:1] != ["QUEUE_NAME"]:
        return []
    return [row[0] for row in lines[1:]]
