"""Horovod's prefix_output_with_timestamp for hpcring.spark.run's ranks: each line their Python writes is
stamped in the launcher's format, however the writes split it; nothing is stamped without the variable."""

from __future__ import annotations

import io
import re
import subprocess
import sys

from support import ROOT

from hpcring.ray.output_stamp import StampedStream

STAMP = r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}"


def test_every_line_is_stamped_once_however_it_is_written() -> None:
    inner = io.StringIO()
    stream = StampedStream(inner, "3", "stdout")  # type: ignore[arg-type]
    assert stream.write("a\nb") == 3
    stream.write("c\n\nd\n")
    lines = inner.getvalue().splitlines()
    assert [re.sub(STAMP, "T", line) for line in lines] == [
        "T[3]<stdout>:a",
        "T[3]<stdout>:bc",
        "T[3]<stdout>:",
        "T[3]<stdout>:d",
    ]


def test_the_worker_stamps_only_when_asked() -> None:
    code = "from hpcring.ray import output_stamp as o; print(o.install_from_env(1)); print('x', flush=True)"
    for value, stamped in (("1", True), ("", False)):
        env = {"PYTHONPATH": str(ROOT), "HPCRING_OUTPUT_TIMESTAMP": value}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True
        ).stdout.splitlines()
        tag = STAMP + r"\[1\]<stdout>:" if stamped else ""
        assert re.fullmatch(tag + str(stamped), out[0]) and re.fullmatch(tag + "x", out[1]), out
