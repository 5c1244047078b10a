"""The job option `requeue` (flag `--requeue-on-limit[=GRACE]`) renders what each scheduler offers to train
past the wall clock (hpcring.schedulers.requeue; the Slurm job itself runs in
tests/integration/slurm/test_slurm_requeue.py): the directives, the trap that tells the ranks, and the line
that requeues or resubmits the job; shellcheck-clean with hostile strings, and refused where impossible."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from sched_helpers import check_shellcheck, cli

HOSTILE = "it's $(touch pwned) `id`"

# profile -> lines the script must hold (each scheduler's documented mechanism)
EXPECTED = {
    "generic-slurm-gpu": [
        "#SBATCH --signal=B:USR1@90",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        '        scontrol requeue "$SLURM_JOB_ID"',
        "# https://slurm.schedmd.com/sbatch.html#OPT_signal (and #OPT_requeue, #OPT_open-mode);",
    ],
    "generic-lsf": [
        "#BSUB -wa USR1",
        "#BSUB -wt 2",  # 90 s, rounded up to LSF's minutes
        '        brequeue "$LSB_JOBID"',
        "# https://www.ibm.com/docs/en/spectrum-lsf/10.1.0?topic=reference-brequeue",
    ],
    "generic-pbs": [
        "#PBS -r y",
        "# The job's own timer: the warning 3510 s after the start.",  # walltime 1 h - 90 s
        'sleep 3510 && kill -s USR1 "$$" &',
        "        qsub {script}",
    ],
    "generic-flux": [
        "# flux: --signal=USR1@90s",
        "        flux batch {script}",
        "# Flux has no requeue: the script resubmits itself with flux batch",
    ],
}


def _job(tmp: Path, **extra: object) -> Path:
    job = {
        "name": HOSTILE,
        "nodes": 2,
        "time": "1:00:00",
        "command": ["python", "train.py", HOSTILE],
        **extra,
    }
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


@pytest.mark.parametrize("profile", sorted(EXPECTED))
def test_each_scheduler_renders_its_warning_and_requeue(profile: str, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    ckpt = tmp_path / f"ckpt {HOSTILE}"
    res = cli(
        "render", "--profile", profile, "--job", str(_job(tmp_path)), "--requeue-on-limit=90",
        "--checkpoint-dir", str(ckpt), "-o", str(script),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    text = script.read_text()
    lines = text.splitlines()
    for want in EXPECTED[profile]:
        assert want.format(script=script) in lines, (want, text)
    assert "trap 'hpcring_warn limit' USR1" in lines and "trap 'hpcring_warn preempt' USR2" in lines
    assert f"export HPCRING_CHECKPOINT_DIR='{tmp_path}/ckpt it'\"'\"'s $(touch pwned) `id`'" in lines
    steps = [line for line in lines if line.startswith("hpcring_step ")]
    assert len(steps) == 1 and steps[0].endswith('|| hpcring_end "$?"')
    assert '    if [ "$1" -eq 85 ]; then' in lines
    check_shellcheck(tmp_path, text)


def test_the_job_file_key_and_its_defaults(tmp_path: Path) -> None:
    """`requeue: true`: 120 s of grace, the checkpoint folder named after the job in the working
    directory, the ranks' own bound unless max_requeues is given."""
    res = cli("render", "--profile", "generic-slurm-gpu", "--job", str(_job(tmp_path, requeue=True)))
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --signal=B:USR1@120" in res.stdout.splitlines()
    assert 'export HPCRING_CHECKPOINT_DIR="$PWD"/hpcring-checkpoint-it-s-touch-pwned-id' in res.stdout
    assert "HPCRING_MAX_REQUEUES" not in res.stdout
    job = _job(tmp_path, requeue={"grace": 60, "max_requeues": 5})
    res = cli("render", "--profile", "generic-slurm-gpu", "--job", str(job))
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --signal=B:USR1@60" in res.stdout and "export HPCRING_MAX_REQUEUES=5" in res.stdout
    plain = cli("render", "--profile", "generic-slurm-gpu", "--job", str(_job(tmp_path)))
    assert "--signal" not in plain.stdout and "hpcring_step" not in plain.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--requeue-on-limit=0"], "--requeue-on-limit [HPCRING_REQUEUE_ON_LIMIT]"),
        (["--requeue-on-limit=soon"], "--requeue-on-limit [HPCRING_REQUEUE_ON_LIMIT]"),
        (["--profile", "generic-pbs", "--requeue-on-limit=3600"], "is not shorter than the job's walltime"),
        (
            ["--profile", "generic-k8s-gpu", "--job-name", "k8s", "--requeue-on-limit"],
            "--requeue-on-limit: not supported with kubernetes",
        ),
    ],
)
def test_bad_requeue_options_are_refused_with_the_reason(
    args: list[str], message: str, tmp_path: Path
) -> None:
    profile = [] if "--profile" in args else ["--profile", "generic-slurm-gpu"]
    res = cli("render", *profile, "--job", str(_job(tmp_path)), *args)
    assert res.returncode != 0 and message in res.stderr, res.stderr


def test_printed_scripts_of_pbs_and_flux_say_how_to_continue(tmp_path: Path) -> None:
    """Without -o the script's path is unknown: the requeue line says to resubmit instead."""
    for profile in ("generic-pbs", "generic-flux"):
        res = cli("render", "--profile", profile, "--job", str(_job(tmp_path)), "--requeue-on-limit")
        assert res.returncode == 0, res.stderr
        assert "printf 'hpcring requeue: resubmit this job script to continue\\n' >&2" in res.stdout


_STEP = (  # stands in for the ranks: waits for the trap's WARNING file, then leaves with 85 (once)
    'if [ -e "$HPCRING_CHECKPOINT_DIR/done" ]; then touch "$HPCRING_CHECKPOINT_DIR/again"; exit 0; fi; '
    'until [ -e "$HPCRING_CHECKPOINT_DIR/WARNING" ]; do sleep 0.1; done; '
    'echo "ranks warned: $(cat "$HPCRING_CHECKPOINT_DIR/WARNING")"; '
    'touch "$HPCRING_CHECKPOINT_DIR/done"; exit 85'
)


@pytest.mark.parametrize(
    ("profile", "submit", "output"),
    [("generic-pbs", ["qsub"], "hpcring.o1234"), ("generic-flux", ["flux", "batch"], "flux-*.out")],
)
def test_a_warned_job_resubmits_its_script_under_the_standins(
    profile: str, submit: list[str], output: str, tmp_path: Path
) -> None:
    """Under the PBS and Flux stand-ins (tests/schedulers/standins): the warning comes 55 s before a
    1-minute limit (PBS: the script's own timer, as PBS has no such signal; Flux: `--signal=USR1@55s`, which
    the stand-in implements from flux-batch(1)), the trap writes `limit` where the ranks look, the step exits
    85, and the script resubmits itself; the resubmitted job's step sees it already ran and ends."""
    from pbs_flux_helpers import calls, tools_env

    env = tools_env(tmp_path)
    ckpt = tmp_path / "ckpt"
    res = cli(
        "submit", "--profile", profile, "--nodes", "1", "--ranks", "1", "--time", "1", "--poll", "0.1",
        "--requeue-on-limit=55", "--checkpoint-dir", str(ckpt), "--script-dir", str(tmp_path / "jobs"),
        "--wait", "--step", _STEP, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    (script,) = (tmp_path / "jobs").glob("hpcring-*.sh")
    for _ in range(300):  # the resubmitted job runs in the background
        if (ckpt / "again").exists():
            break
        time.sleep(0.1)
    assert (ckpt / "again").exists()
    text = "".join(p.read_text() for p in sorted(tmp_path.glob(output)))
    assert "hpcring requeue: limit warning at " in text and "ranks warned: limit" in text, text
    assert "hpcring requeue: the ranks checkpointed into" in text
    tool, *verb = submit
    subs = [c["argv"] for c in calls(env) if c["tool"] == tool and c["argv"][: len(verb)] == verb]
    assert subs == [[*verb, str(script)], [*verb, str(script)]]  # submitted, then resubmitted by the job


def test_the_guides_example_renders(tmp_path: Path) -> None:
    """docs/guide/elastic.md, "Longer than the wall clock": its job file and render command, as shown."""
    from support import ROOT

    guide = (ROOT / "docs" / "guide" / "elastic.md").read_text()
    section = guide.split("## Longer than the wall clock", 1)[1]
    job_text = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "job.yaml").write_text(job_text)
    command = section.split("```sh\n", 1)[1].split("\n", 1)[0].split("#", 1)[0].split()
    assert command[:2] == ["hpcring", "render"], command
    res = cli(*command[1:], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "job.sh").read_text()
    assert "#SBATCH --signal=B:USR1@120" in text and "#SBATCH --requeue" in text
    check_shellcheck(tmp_path, text, "checked.sh")
