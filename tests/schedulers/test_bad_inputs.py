"""Bad job inputs of `hpcring map`, `render` and `submit` (issue 25): each is refused with exit 2 and one line
naming the field, the value and what is allowed, through the real CLI. Where a flag has a job-file key, both
are tried and must give the same message after the name of the field: flags and job files share one
validation (`job.check`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from sched_helpers import cli, make_plan

from hpcring.errors import ConfigError
from hpcring.schedulers import job as jobmod
from hpcring.schedulers import lsf_batch, walltime
from hpcring.schedulers.job import JobSpec


def refused(res: subprocess.CompletedProcess[str], *pieces: str) -> str:
    """The one line of a refusal (exit 2, no traceback) holding every piece; returned after `error: `."""
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    line = res.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, res.stderr
    for piece in pieces:
        assert piece in line, (piece, line)
    return line.split("error: ", 1)[1]


def job_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


# flag, job-file key, bad value, what is allowed
COUNTS = [
    ("--nodes", "nodes", "0", "allowed: 1 or more"),
    ("--nodes", "nodes", "-3", "allowed: 1 or more"),
    ("--ranks", "ranks", "0", "allowed: 1 or more"),
    ("--ranks-per-node", "ranks_per_node", "0", "allowed: 1 or more"),
    ("--gpus-per-rank", "gpus_per_rank", "-1", "allowed: 0 or more"),
    ("--cpus-per-rank", "cpus_per_rank", "0", "allowed: 1 or more"),
    ("--cpus-per-rank", "cpus_per_rank", "-2", "allowed: 1 or more"),
    ("--threads-per-core", "threads_per_core", "0", "allowed: 1 or more"),
    ("--threads-per-core", "threads_per_core", "9", "allowed: 8 or less"),
]


@pytest.mark.parametrize(("flag", "key", "value", "allowed"), COUNTS, ids=[f"{c[0]}={c[2]}" for c in COUNTS])
def test_count_flag_and_job_key_refused_alike(
    flag: str, key: str, value: str, allowed: str, tmp_path: Path
) -> None:
    """`--cpus-per-rank 0` used to render `--cpus-per-task=0 --cpu-bind=mask_cpu:0x0,...` and
    `--ranks-per-node 0` silently meant the default; the job file already refused them."""
    var = "HPCRING_" + flag[2:].upper().replace("-", "_")
    by_flag = refused(
        cli("render", "--profile", "frontier", "--account", "a", flag, value, "--", "true"),
        f"{flag} [{var}]: {value}",
        allowed,
    )
    by_file = refused(
        cli(
            "render",
            "--profile",
            "frontier",
            "--account",
            "a",
            "--job",
            job_file(tmp_path, f"{key}: {value}\n"),
        ),
        f"{key}: {value}",
        allowed,
    )
    assert by_flag.split(": ", 1)[1] == by_file.split(f"{key}: ", 1)[1]


def test_map_submit_and_env_twins_use_the_same_check(tmp_path: Path) -> None:
    refused(
        cli("map", "--profile", "frontier", "--cpus-per-rank", "0"), "--cpus-per-rank", "allowed: 1 or more"
    )
    refused(
        cli(
            "submit",
            "--profile",
            "frontier",
            "--account",
            "a",
            "--ranks-per-node",
            "0",
            "--dry-run",
            "--",
            "x",
        ),
        "--ranks-per-node [HPCRING_RANKS_PER_NODE]: 0 is too small; allowed: 1 or more",
    )
    refused(
        cli("map", "--profile", "frontier", env={"HPCRING_GPUS_PER_RANK": "-4"}),
        "--gpus-per-rank [HPCRING_GPUS_PER_RANK]: -4",
        "allowed: 0 or more",
    )
    refused(
        cli("map", "--profile", "frontier", "--nodes", "two"), "--nodes [HPCRING_NODES]: 'two'", "integer"
    )
    # 0 GPUs per rank is a CPU-only job, not a mistake.
    ok = cli(
        "map", "--profile", "frontier", "--gpus-per-rank", "0", "--ranks-per-node", "2", "--format", "json"
    )
    assert ok.returncode == 0 and '"gpus": []' in ok.stdout, ok.stderr


@pytest.mark.parametrize(("flag", "value"), [("--poll", "0"), ("--poll", "-1"), ("--wait-timeout", "0")])
def test_submit_durations_must_be_positive(flag: str, value: str) -> None:
    refused(
        cli("submit", "--profile", "generic-lsf", flag, value, "--dry-run", "--", "true"),
        f"{flag} [HPCRING_",
        f"{value}",
        "allowed: a number of seconds above 0",
    )


def test_job_file_not_utf8_is_one_line(tmp_path: Path) -> None:
    """A Latin-1 job file was a UnicodeDecodeError traceback with exit 1; profiles already said this."""
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: café\ncommand: true\n".encode("latin-1"))
    refused(
        cli("render", "--profile", "generic-lsf", "--job", str(path)),
        f"job file {str(path)!r} is not UTF-8 text: byte 0xe9 at offset 9; save it as UTF-8",
    )
    missing = tmp_path / "none.yaml"
    refused(
        cli("map", "--profile", "generic-lsf", "--job", str(missing)),
        f"job file {str(missing)!r} does not exist",
    )
    refused(cli("map", "--profile", "generic-lsf", "--job", str(tmp_path)), "is a directory, not a file")


BAD_TIMES = [
    ("1:70", "seconds 70 must be below 60"),
    ("2:60:00", "minutes 60 must be below 60"),
    ("0:10:75", "seconds 75 must be below 60"),
    ("1-24", "hours 24 must be below 24"),
    ("1-2:60", "minutes 60 must be below 60"),
    ("1-2:03:60", "seconds 60 must be below 60"),
]


@pytest.mark.parametrize(("value", "why"), BAD_TIMES, ids=[t[0] for t in BAD_TIMES])
def test_walltime_fields_beyond_their_unit_refused(value: str, why: str, tmp_path: Path) -> None:
    """`--time 1:70` rendered `--time=00:02:10`; each of Slurm's forms now refuses a field past its unit."""
    forms = f"allowed forms: {walltime.FORMS}"
    by_flag = refused(
        cli("render", "--profile", "frontier", "--account", "a", "--time", value, "--", "true"),
        f"--time [HPCRING_TIME]: bad walltime {value!r}: {why}",
        forms,
    )
    by_file = refused(
        cli("map", "--profile", "frontier", "--job", job_file(tmp_path, f'time: "{value}"\n')),
        f"time: bad walltime {value!r}: {why}",
    )
    assert by_flag.split(": ", 1)[1] == by_file.split("time: ", 1)[1]


def test_walltime_forms_slurm_accepts() -> None:
    """The leading field of each form is unbounded; every later field stays below its unit."""
    for value, seconds in (
        (90, 5400),
        ("90", 5400),
        ("1:59", 119),
        ("30:00:00", 108000),
        ("1:59:59", 7199),
        ("2-0", 172800),
        ("1-23", 169200),
        ("1-23:59", 172740),
        ("0-00:00:59", 59),
    ):
        assert walltime.parse(value) == seconds, value
    for bad in ("1:2:3:4", "-5", "1h", True):
        with pytest.raises(ValueError, match="allowed forms: minutes, 'M:SS'"):
            walltime.parse(bad)  # type: ignore[arg-type]


def test_gpus_per_rank_must_divide_the_nodes_gpus(tmp_path: Path) -> None:
    """3 of Frontier's 8 GCDs per rank left 2 idle and gave rank 1 GCDs 3-5 across two NUMA domains."""
    allowed = "allowed: 0, 1, 2, 4 or 8"
    for argv in (
        ("--gpus-per-rank", "3"),
        ("--job", job_file(tmp_path, "gpus_per_rank: 3\n")),
        ("--gpus-per-rank", "5", "--ranks-per-node", "1"),
    ):
        refused(cli("map", "--profile", "frontier", *argv), "does not divide the 8 GPUs", "idle", allowed)
    # Summit's 6 GPUs: 3 per rank is a divisor, two ranks per node, each within its socket.
    ok = cli("map", "--profile", "summit", "--gpus-per-rank", "3", "--format", "json")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count('"gpus": [0, 1, 2]') == 1 and ok.stdout.count('"gpus": [3, 4, 5]') == 1


BAD_COMMANDS = [
    ("command: 5", "command: 5"),
    ("command: {a: 1}", "command: {'a': 1}"),
    ("command: []", "command: []"),
    ("command: [python, 1]", "command: ['python', 1]"),
    ("command: ''", "command: ''"),
    ("steps: [{run: 7}]", "steps[0].run: 7"),
]


@pytest.mark.parametrize(("text", "named"), BAD_COMMANDS, ids=[c[0] for c in BAD_COMMANDS])
def test_command_neither_string_nor_list(text: str, named: str, tmp_path: Path) -> None:
    line = refused(
        cli("render", "--profile", "generic-lsf", "--job", job_file(tmp_path, text + "\n")),
        f"{named} is not allowed; allowed: a non-empty string (a shell command line, run by `bash -c`) or a "
        "non-empty list of strings (the argv, kept exactly)",
    )
    assert "expected A list" not in line


def test_empty_step_flag_refused_like_an_empty_run() -> None:
    refused(
        cli("render", "--profile", "generic-lsf", "--step", ""), "--step [HPCRING_STEPS]: ''", "non-empty"
    )


@pytest.mark.parametrize(
    ("profile", "prefix"),
    [
        ("generic-slurm-gpu", "#SBATCH"),
        ("generic-lsf", "#BSUB"),
        ("generic-pbs", "#PBS"),
        ("generic-flux", "# flux:"),
    ],
)
def test_directive_error_names_the_profiles_own_directive(profile: str, prefix: str) -> None:
    line = refused(
        cli("render", "--profile", profile, "--job-name", "a\nb", "--", "true"),
        f"job name 'a\\nb' contains a newline; it would end the {prefix} line",
    )
    assert "#SBATCH/#BSUB" not in line
    with pytest.raises(
        ConfigError, match=f"account 'x\\\\ry' contains a carriage return; it would end the {prefix}"
    ):
        make_plan(profile, account="x\ry", command=("true",))


def test_lsf_default_output_file_is_one_safe_name() -> None:
    """The job name stays as given on `-J`; the default `-o` file loses the `/` that made bsub write into a
    directory that need not exist."""
    text = cli("render", "--profile", "generic-lsf", "--job-name", "runs/a b", "--", "true")
    assert text.returncode == 0, text.stderr
    assert '#BSUB -J "runs/a b"\n' in text.stdout and "#BSUB -o runs_a_b.%J.out\n" in text.stdout
    assert lsf_batch.output_name("../x") == "_x.%J.out"
    assert lsf_batch.output_name("-q vip") == "q_vip.%J.out"
    assert lsf_batch.output_name("///") == "_.%J.out"
    assert lsf_batch.output_name("train-1.b") == "train-1.b.%J.out"
    given = make_plan("generic-lsf", name="a/b", output="logs/a.out", command=("true",))
    assert [d.value for d in given.directives if d.flag == "-o"] == ["logs/a.out"]


def test_check_is_the_job_files_validation() -> None:
    """`job.check` is what both paths call: a job document's keys, a flag label, the walltime in seconds."""
    assert jobmod.check({"time": "1:30:00", "cpus_per_rank": 2}, "j.yaml") == 5400
    assert jobmod.check({}, "") is None
    with pytest.raises(ConfigError, match=r"^--x: 0 is too small; allowed: 1 or more$"):
        jobmod.check({"nodes": 0}, "", lambda path: "--x")
    with pytest.raises(ConfigError, match=r"^j.yaml: nodes: 0 is too small"):
        jobmod.from_mapping({"nodes": 0}, "j.yaml")
    assert jobmod.from_mapping({"nodes": 2, "command": "true"}) == JobSpec(
        nodes=2, steps=(jobmod.Step(("bash", "-c", "true")),)
    )
