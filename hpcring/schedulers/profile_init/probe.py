"""Run the tools `profiles init` reads (each with a timeout; a missing or failing tool means the fact is
unknown), or read their recorded outputs from a directory (`--from-dir`: one `<source>.txt` per source)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from hpcring.schedulers.profile_init import slurm_facts

# source name -> the command whose standard output it is
SOURCES: dict[str, tuple[str, ...]] = {
    "lstopo": ("lstopo-no-graphics", "--of", "xml"),
    "nvidia-smi-topo": ("nvidia-smi", "topo", "-m"),
    "rocm-smi-toponuma": ("rocm-smi", "--showtoponuma"),
    "scontrol-config": ("scontrol", "show", "config"),
    "scontrol-partition": ("scontrol", "show", "partition"),
    "sinfo": ("sinfo", "--noheader", f"--format={slurm_facts.SINFO_FORMAT}"),
    "qstat-queues": ("qstat", "-Qf"),
    "qstat-server": ("qstat", "-Bf"),
    "flux-resource": ("flux", "resource", "list"),
    "bqueues": ("bqueues",),
}
FALLBACK_EXE = {"lstopo-no-graphics": "lstopo"}
TIMEOUT_S = 30.0

Outputs = dict[str, str]


def run_all(timeout_s: float = TIMEOUT_S) -> tuple[Outputs, list[str]]:
    """Standard output of every source whose tool is installed and succeeds, with one note per failure."""
    out: Outputs = {}
    notes: list[str] = []
    for name, argv in SOURCES.items():
        exe = shutil.which(argv[0]) or shutil.which(FALLBACK_EXE.get(argv[0], argv[0]))
        if exe is None:
            continue
        try:
            res = subprocess.run(
                [exe, *argv[1:]], capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            notes.append(f"{' '.join(argv)}: {exc}")
            continue
        if res.returncode != 0:
            first = (res.stderr.strip().splitlines() or [""])[0]
            notes.append(f"{' '.join(argv)} exited with {res.returncode}: {first}")
            continue
        out[name] = res.stdout
    return out, notes


def read_dir(directory: Path) -> Outputs:
    """Recorded outputs: `<source>.txt` for each source recorded; others are unknown."""
    out: Outputs = {}
    for name in SOURCES:
        path = directory / f"{name}.txt"
        if path.is_file():
            out[name] = path.read_text("utf-8", errors="replace")
    return out
