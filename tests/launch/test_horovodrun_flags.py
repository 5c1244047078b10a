"""horovodrun's flags on `hpcring run`: each honoured (checked here) or refused with one line; bad input is
one line too, never an argparse usage dump. In-process for what stops before launching, one real launch for
what the ranks must see."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

from hpcring.cli import main, subcommand_parser
from hpcring.cli.horovodrun_flags import REFUSED

_VALUE = {"--num-nccl-streams": "2", "--thread-affinity": "1", "--gloo-timeout-seconds": "30"}
_VALUE |= {"--nics": "eth0", "--binding-args": "x"}


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_refused_flags_say_why_in_one_line(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "-np", "2", flag, *([_VALUE[flag]] if flag in _VALUE else []), "--", "true"]
    assert main(argv) == 2
    line = one_line(capsys.readouterr().err)
    assert f"{flag} is not supported: " in line and len(line) > len(flag) + 40


def test_command_line_mistakes_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["run", "--no-such-flag", "--", "true"], ["run", "--ssh-port"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        line = one_line(capsys.readouterr().err)
        assert line.startswith("hpcring run: error: ") and "usage" not in line
    assert main(["run", "-np", "2", "--reset-limit", "2", "--", "true"]) == 2
    assert "--reset-limit applies to elastic jobs: add --min-np" in one_line(capsys.readouterr().err)


def test_version_and_check_build(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--version"]) == 0
    assert re.match(r"hpcring \d+\.\d+", capsys.readouterr().out)
    assert main(["run", "--check-build"]) == 0
    out = capsys.readouterr().out
    assert "[X] PyTorch" in out and "[X] MPI" in out and "[ ] Gloo" in out


def test_mpi_side_flags_reach_the_mpiexec_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "id_test"
    key.write_text("not a real key")
    argv = ["run", "-np", "2", "--mpi", "openmpi", "--dry-run", "-p", "2222", "-i", str(key)]
    argv += ["--network-interface", "lo", "--tcp", "--mpi-args", "--mca btl_base_verbose 0", "--", "true"]
    assert main(argv) == 0
    line = capsys.readouterr().out
    assert f"PRTE_MCA_plm_ssh_args='-p 2222 -i {key}'" in line
    assert "--mca btl_tcp_if_include lo --mca oob_tcp_if_include lo" in line
    assert "--mca pml ob1 --mca btl tcp,self" in line and "--mca btl_base_verbose 0" in line


def test_every_elastic_flag_has_its_environment_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    twins = {
        "HPCRING_MIN_NP": ("min_np", "2"),
        "HPCRING_MAX_NP": ("max_np", "5"),
        "HPCRING_SLOTS_PER_HOST": ("slots_per_host", "4"),
        "HPCRING_HOST_DISCOVERY_SCRIPT": ("host_discovery_script", "/bin/true"),
        "HOROVOD_ELASTIC_TIMEOUT": ("elastic_timeout", "33"),
        "HPCRING_RESET_LIMIT": ("reset_limit", "3"),
        "HPCRING_BLACKLIST_COOLDOWN_RANGE": ("blacklist_cooldown_range", ["1", "9"]),
    }
    for var, (_, value) in twins.items():
        monkeypatch.setenv(var, " ".join(value) if isinstance(value, list) else value)
    args = subcommand_parser("run").parse_args(["--", "true"])
    for attr, value in twins.values():
        assert getattr(args, attr) == value, attr
    monkeypatch.setenv("HPCRING_ELASTIC_TIMEOUT", "44")  # ours wins over Horovod's
    assert subcommand_parser("run").parse_args(["--", "true"]).elastic_timeout == "44"


def test_config_file_errors_name_the_allowed_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "horovod.yaml"
    cfg.write_text("params:\n  fusion_treshold_mb: 8\n")
    assert main(["run", "-np", "1", "--config-file", str(cfg), "--", "true"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "params.fusion_treshold_mb" in line and "fusion_threshold_mb" in line


PROBE = """
import os
from mpi4py import MPI
total = MPI.COMM_WORLD.allreduce(1)
names = ("HPCRING_ALLREDUCE_ALGORITHM", "HOROVOD_HIERARCHICAL_ALLREDUCE", "HPCRING_CACHE_CAPACITY",
         "HOROVOD_AUTOTUNE", "HOROVOD_AUTOTUNE_LOG", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "HPCRING_CYCLE_TIME",
         "HPCRING_FUSION_THRESHOLD", "HPCRING_STALL_CHECK_DISABLE")
print("ENV", total, *(f"{n}={os.environ.get(n)}" for n in names))
"""


def test_flags_reach_the_ranks_in_a_real_launch(tmp_path: Path) -> None:
    """One launch at 2 ranks over TCP only: engine and autotune variables from flags and from Horovod's
    config file (the command line wins), per-rank output files, timestamped prefixes."""
    cfg = tmp_path / "horovod.yaml"
    cfg.write_text(
        "params:\n  fusion_threshold_mb: 8\n  cycle_time_ms: 7\n"
        "stall_check:\n  enabled: false\nautotune:\n  warmup_samples: 2\n"
    )
    outdir = tmp_path / "logs"
    argv = [sys.executable, "-m", "hpcring", "run", "-np", "2", "--tcp", "--hierarchical-allreduce"]
    argv += ["--disable-cache", "--autotune", "--autotune-log-file", str(tmp_path / "tune.csv")]
    argv += ["--fusion-threshold-mb", "16", "--config-file", str(cfg), "--output-filename", str(outdir)]
    argv += ["--prefix-output-with-timestamp", "--", sys.executable, "-c", PROBE]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCRING_", "HOROVOD_"))}
    res = subprocess.run(
        ["timeout", "-k", "5", "120", *argv], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stderr[-2000:]
    want = (
        "ENV 2 HPCRING_ALLREDUCE_ALGORITHM=hierarchical HOROVOD_HIERARCHICAL_ALLREDUCE=1 "
        f"HPCRING_CACHE_CAPACITY=0 HOROVOD_AUTOTUNE=1 HOROVOD_AUTOTUNE_LOG={tmp_path / 'tune.csv'} "
        f"HOROVOD_AUTOTUNE_WARMUP_SAMPLES=2 HPCRING_CYCLE_TIME=7 HPCRING_FUSION_THRESHOLD={16 << 20} "
        "HPCRING_STALL_CHECK_DISABLE=1"
    )
    stamped = re.compile(r"^\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\[(\d)\]<stdout>:(.*)$")
    lines = {m.group(1): m.group(2) for line in res.stdout.splitlines() if (m := stamped.match(line))}
    assert lines == {"0": want, "1": want}, res.stdout
    for rank in (0, 1):
        assert (outdir / f"rank.{rank}" / "stdout").read_text() == want + "\n"


def test_the_other_spellings_and_switches(tmp_path: Path) -> None:
    """Flags checked without a launch: what they turn into for the ranks and for each MPI flavour."""
    from hpcring.cli import horovodrun_flags
    from hpcring.errors import ConfigError

    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    argv = ["--mpi", "-hostfile", str(hostfile), "--no-hierarchical-allreduce", "--log-without-timestamp"]
    argv += [
        "--log-hide-timestamp",
        "--no-hierarchical-allgather",
        "--network-interface",
        "eth1",
        "--",
        "true",
    ]
    args = subcommand_parser("run").parse_args(argv)
    assert args.mpi is None and args.hostfile == str(hostfile)
    horovodrun_flags.refuse(args)  # the accepted no-ops are not refusals
    assert horovodrun_flags.rank_settings(args) == {
        "HPCRING_ALLREDUCE_ALGORITHM": "native",
        "HOROVOD_HIERARCHICAL_ALLREDUCE": "0",
    }
    assert horovodrun_flags.mpi_extras(args, "mpich") == (("-iface", "eth1"), {"FI_TCP_IFACE": "eth1"})
    args.tcp = True
    assert horovodrun_flags.mpi_extras(args, "mpich")[1]["FI_PROVIDER"] == "tcp"
    args.ssh_port = "2222"
    with pytest.raises(ConfigError, match="hydra takes no ssh options"):
        horovodrun_flags.mpi_extras(args, "mpich")
    args.ssh_port = "70000"
    with pytest.raises(ConfigError, match="not a TCP port"):
        horovodrun_flags.mpi_extras(args, "openmpi")
