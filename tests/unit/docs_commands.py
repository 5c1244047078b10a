"""The shell commands of README.md and docs/guide/*.md, and the reviewed list of those the docs test does not
run as written (test_docs_readme.py runs every other one).

A command is a line of a fenced block tagged `sh`, `bash`, `console` or `shell`, or untagged; blocks of output
are tagged `text`. Each entry below names one command (a regular expression matched against the whole line,
comment included, so a changed command must be reviewed again) and why it is not run here. `SUBSTITUTED`
commands run in a form that stands in for something only the reader has (their URL, their clone).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]
SHELL = ("", "sh", "bash", "console", "shell")

CLUSTER = "needs a cluster: hosts or a scheduler this machine does not have"

# (page, regular expression for the line, why it is not run here)
NOT_RUN: list[tuple[str, str, str]] = [
    ("README.md", r"make demo|make test", "the contributors' set-up: CI runs it (.ci/run: make test)"),
    (
        "*",
        r"pip install torch==2\.13\.0 --index-url https://download\.pytorch\.org/whl/cpu.*",
        "needs download.pytorch.org, which CI cannot reach; the tests' environments hold that build",
    ),
    ("*", r"hpcring run -np 8 -H node1:4,node2:4 -- python train\.py.*", CLUSTER + " (node1, node2)"),
    ("*", r"hpcring run -np 8 --hostfile hosts -- python train\.py.*", CLUSTER + " (the hostfile's nodes)"),
    ("*", r"srun .*", CLUSTER + " (Slurm)"),
    ("*", r"sbatch .*", CLUSTER + " (Slurm)"),
    ("*", r"horovodrun .*", "Horovod's own launcher, shown as the 'before' of a migration"),
    ("*", r"hpcring submit .*--wait.*", CLUSTER + " (submits a job and waits for it)"),
    (
        "*",
        r"hpcring run -np 4 --min-np 2 (--max-np 8 )?--host-discovery-script \./(hosts|discover_hosts)\.sh.*",
        "the discovery script lists the reader's hosts; elastic.md's one-machine elastic line runs here",
    ),
    ("elastic.md", r"hpcring run -np 3 --min-np 2 -H node1:1,node2:1,node3:1 .*", CLUSTER + " (three hosts)"),
    (
        "quickstart.md",
        r"hpcring run -np 4 -- python examples/train_digits\.py --epochs 3",
        "run from the checkout at 1, 2 and 4 ranks (12 epochs) by tests/torch/test_example_digits.py",
    ),
    ("spark.md", r"apt-get install openjdk-17-jre-headless.*", "needs root and Debian's archive (.ci/run)"),
    (
        "torch.md",
        r"hpcring run --horovod -np 4 -- python pytorch_mnist\.py.*",
        "Horovod's pytorch_mnist.py example, which downloads MNIST",
    ),
    (
        "clusters.md",
        r"docker (build|push) .*",
        "needs Docker and a registry; CI builds the MPIJob image with podman (test_mpijob_pods.py)",
    ),
    (
        "containers.md",
        r"(docker|podman) .*|apptainer build .*|\s*apptainer build .*|apptainer (run|test|run-help) .*",
        "needs Docker or Apptainer; tests/containers builds and runs the images with podman",
    ),
    (
        "containers.md",
        r"(apptainer|singularity) exec .*",
        "a line of a rendered job script (test_render.py pins it): runs on that cluster",
    ),
]

# (page, line, what runs instead, why)
SUBSTITUTED: list[tuple[str, str, str, str]] = [
    (
        "README.md",
        "git clone https://github.com/ORG/hpcring.git && cd hpcring",
        "cd {checkout}",
        "the reader's clone: a copy of this checkout's files stands in for it",
    ),
    (
        "README.md",
        "HPCRING_GIT=https://github.com/ORG/hpcring.git",
        "HPCRING_GIT=file://{root}",
        "the reader's URL: this checkout's own git repository stands in for it",
    ),
    (
        "cli.md",
        "hpcring profiles init -o mysite.yaml",
        "hpcring profiles init --scheduler slurm -o mysite.yaml",
        "meant for a compute node, where the batch system answers; here none does, so it is named",
    ),
]


@dataclass(frozen=True)
class Block:
    """One fenced block of shell commands: its page, first line number and commands (continuations joined)."""

    page: Path
    line: int
    commands: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.page.name}:{self.line}"


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    lang: str | None = None
    start, lines = 0, []
    for number, raw in enumerate(page.read_text().splitlines(), 1):
        if raw.startswith("```"):
            if lang is None:
                lang, start, lines = raw[3:].strip(), number, []
            else:
                if lang in SHELL and lines:
                    found.append(Block(page, start, tuple(_joined(lines))))
                lang = None
        elif lang is not None and raw.strip():
            lines.append(raw.strip())
    return found


def _joined(lines: list[str]) -> list[str]:
    out: list[str] = []
    for line in lines:
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1].rstrip() + " " + line
        else:
            out.append(line)
    return out


def all_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks(page)]


def not_run_reason(page: Path, command: str) -> str | None:
    for name, pattern, reason in NOT_RUN:
        if name in ("*", page.name) and re.fullmatch(pattern, command):
            return reason
    return None


def substitute(page: Path, command: str) -> str | None:
    for name, line, instead, _ in SUBSTITUTED:
        if name == page.name and command == line:
            return instead
    return None


def strip_comment(command: str) -> str:
    """The command without its trailing `# ...` comment (a `#` outside quotes, after a space)."""
    quote = ""
    for i, ch in enumerate(command):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and i > 0 and command[i - 1] == " ":
            return command[:i].rstrip()
    return command
