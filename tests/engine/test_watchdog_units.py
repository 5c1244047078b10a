"""The collective watchdog's bookkeeping and the setting that drives it (the real jobs, with a frozen rank,
are in tests/engine/test_engine_timeout.py)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from hpcring.cli import subcommand_parser
from hpcring.cli.run import collective_timeout
from hpcring.cli.run import engine_settings as run_settings
from hpcring.config import DEFAULT_COLLECTIVE_TIMEOUT_S, EngineSettings, engine_settings
from hpcring.contracts import elastic as contract
from hpcring.engine import OpType, Signature
from hpcring.engine.engine_state import EngineState
from hpcring.engine.request import Request
from hpcring.engine.responses import Response
from hpcring.engine.set_state import SetState
from hpcring.engine.watchdog import (
    EXCHANGE,
    NEGOTIATION,
    Watchdog,
    exit_status,
    poll_interval,
    roll_call_window,
)
from hpcring.errors import COLLECTIVE_TIMEOUT_EXIT_STATUS, CollectiveTimeoutError, ConfigError

HOSTS = ("n0", "n0", "n1", "n1")


def make(timeout: float, rank: int = 0, ranks: tuple[int, ...] = (0, 1, 2, 3)) -> tuple[Watchdog, SetState]:
    settings = EngineSettings(collective_timeout_s=timeout)
    state = EngineState(settings)
    topo = SimpleNamespace(comm=None, rank=ranks.index(rank), size=len(ranks))
    st = state.sets[0] = SetState(0, ranks, topo, settings)
    return Watchdog(state, rank, HOSTS), st


def request(name: str, op: OpType = OpType.ALLREDUCE) -> Request:
    x = np.ones(2)
    return Request(Signature(name, op, "float64", (2,), "sum"), 0, x, np.empty_like(x))


def response(req: Request, ready_at: float = 0.0) -> Response:
    return Response(req.sig, req, None, None, ready_at)


def test_the_clock_starts_at_the_first_poll_that_sees_a_phase() -> None:
    dog, st = make(5.0)
    assert dog.observe(100.0) is None  # no phase in progress
    cur = dog.current = (NEGOTIATION, st, None)
    assert dog.observe(100.0) is None  # first seen now
    assert dog.observe(104.9) is None
    assert dog.observe(105.0) == (cur, 5.0)
    dog.current = (NEGOTIATION, st, None)  # equal, but a new round: its own clock
    assert dog.observe(105.5) is None
    assert dog.observe(110.0) is None
    dog.current = None  # the cycle ended
    assert dog.observe(1000.0) is None
    dog.current = cur
    assert dog.observe(1001.0) is None, "a phase seen again after a gap starts again"


def test_an_exchange_waits_from_when_it_was_agreed() -> None:
    dog, st = make(5.0)
    agreed = response(request("a"), ready_at=90.0)
    cur = dog.current = (EXCHANGE, st, [agreed])
    assert dog.observe(96.0) is None  # first seen late: the poll does not know the start yet
    assert dog.observe(101.0) == (cur, 11.0)


def test_timeout_zero_is_off() -> None:
    dog, st = make(0.0)
    dog.current = (EXCHANGE, st, [response(request("a"))])
    assert dog.observe(0.0) is None and dog.observe(1e9) is None
    dog.start()
    assert dog._thread is None, "no thread when off"


def test_exchange_message_names_op_tensors_peers_hosts_and_wait() -> None:
    dog, st = make(5.0, rank=2)
    batch = [response(request(f"grad.{i}")) for i in range(10)] + [response(request("b", OpType.BROADCAST))]
    cur = dog.current = (EXCHANGE, st, batch)
    msg = dog.describe(cur, 6.25)
    assert msg.startswith("hpcring: collective timeout on rank 2 (host n1): ")
    assert "allreduce of 'grad.0', 'grad.1'" in msg and "'grad.7' and 2 more" in msg
    assert "'grad.8'" not in msg
    assert "broadcast of 'b'" in msg
    assert "in process set 0 has not completed 6.2 s after every rank submitted it" in msg
    assert "HPCRING_COLLECTIVE_TIMEOUT=5" in msg
    assert "one or more of ranks 0 (host n0), 1 (host n0), 3 (host n1): this rank waits inside MPI" in msg
    assert "2 (host" not in msg.split("Not heard from")[1], "a rank is not its own peer"


def test_the_roll_call_names_the_silent_peers() -> None:
    dog, st = make(5.0, rank=2)
    cur = (EXCHANGE, st, [response(request("a"))])
    assert dog.peers(cur) == [0, 1, 3]
    msg = dog.describe(cur, 5.0, heard={0, 3})
    assert "Not heard from: rank(s) 1 (host n0): they did not answer a roll call" in msg
    assert "ranks 0 (host n0), 3 (host n1) answered" in msg
    msg = dog.describe(cur, 5.0, heard=set())
    assert "Not heard from: rank(s) 0 (host n0), 1 (host n0), 3 (host n1): they did not" in msg
    assert "answered" not in msg
    msg = dog.describe(cur, 5.0, heard={0, 1, 3})
    assert "Every peer answered a roll call" in msg and "Not heard from" not in msg


def test_negotiation_message_names_what_is_pending_and_the_set_members_only() -> None:
    dog, st = make(2.0, rank=1, ranks=(1, 3))
    st.id = 4
    st.inflight["step"] = request("step")
    cur = dog.current = (NEGOTIATION, st, None)
    msg = dog.describe(cur, 3.0)
    assert "negotiation round of process set 4 has not completed in 3.0 s" in msg
    assert "pending here: allreduce of 'step'" in msg
    assert "ranks 3 (host n1):" in msg and "0 (host" not in msg
    st.inflight.clear()
    assert "nothing pending on this rank" in dog.describe(cur, 3.0)


def test_poll_interval_is_bounded() -> None:
    assert poll_interval(300) == 1.0
    assert poll_interval(3) == pytest.approx(0.3)
    assert poll_interval(0.1) == 0.05
    assert roll_call_window(300) == 3.0


def test_exit_status_is_the_elastic_reset_under_the_driver() -> None:
    assert exit_status({}) == COLLECTIVE_TIMEOUT_EXIT_STATUS == 70
    assert exit_status({contract.DIRECTORY: "/tmp/commits"}) == contract.RESET_EXIT_CODE


def test_expiry_fails_pending_requests_then_ends_the_process() -> None:
    """The real thread, with the process exit replaced by a recorder (the real exit is in the job tests)."""
    dog, st = make(0.2)
    ended: list[int] = []
    done = threading.Event()

    def record(status: int) -> None:
        ended.append(status)
        done.set()

    dog._exit = record
    req = request("stuck")
    st.inflight["stuck"] = req
    dog.current = (EXCHANGE, st, [response(req)])
    dog.start()
    with pytest.raises(CollectiveTimeoutError, match="allreduce of 'stuck'") as info:
        req.handle.wait(timeout=30)
    assert info.value.exit_status == COLLECTIVE_TIMEOUT_EXIT_STATUS
    assert dog._state.closed, "new submissions are refused"
    assert done.wait(30)
    assert ended == [COLLECTIVE_TIMEOUT_EXIT_STATUS]


def test_setting_parses_and_refuses_bad_values() -> None:
    assert engine_settings({}).collective_timeout_s == DEFAULT_COLLECTIVE_TIMEOUT_S == 300.0
    assert engine_settings({"HPCRING_COLLECTIVE_TIMEOUT": "2.5"}).collective_timeout_s == 2.5
    assert engine_settings({"HPCRING_COLLECTIVE_TIMEOUT": "0"}).collective_timeout_s == 0.0
    for bad, why in (("-1", "out of range"), ("soon", "not a number"), ("nan", "out of range")):
        with pytest.raises(ConfigError, match=why) as info:
            engine_settings({"HPCRING_COLLECTIVE_TIMEOUT": bad})
        assert f"HPCRING_COLLECTIVE_TIMEOUT={bad!r}" in str(info.value)
        assert "allowed: a number of seconds > 0" in str(info.value) and "0 to turn" in str(info.value)


def test_run_flag_and_env_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = subcommand_parser("run")
    monkeypatch.delenv("HPCRING_COLLECTIVE_TIMEOUT", raising=False)
    args = parser.parse_args(["-np", "2", "--", "true"])
    assert collective_timeout(args) == 300.0
    assert "HPCRING_COLLECTIVE_TIMEOUT" not in run_settings(args)
    args = parser.parse_args(["-np", "2", "--collective-timeout", "20", "--", "true"])
    assert run_settings(args)["HPCRING_COLLECTIVE_TIMEOUT"] == "20"
    monkeypatch.setenv("HPCRING_COLLECTIVE_TIMEOUT", "7.5")
    args = parser.parse_args(["-np", "2", "--", "true"])
    assert run_settings(args)["HPCRING_COLLECTIVE_TIMEOUT"] == "7.5"
    args = parser.parse_args(["-np", "2", "--collective-timeout", "0", "--", "true"])
    assert run_settings(args)["HPCRING_COLLECTIVE_TIMEOUT"] == "0", "the flag wins over the variable"
    for bad in ("-3", "abc"):
        args = parser.parse_args(["-np", "2", "--collective-timeout", bad, "--", "true"])
        with pytest.raises(ConfigError, match=r"--collective-timeout=.*allowed: a number of seconds > 0"):
            run_settings(args)
    monkeypatch.setenv("HPCRING_COLLECTIVE_TIMEOUT", "-1")
    args = parser.parse_args(["-np", "2", "--", "true"])
    with pytest.raises(ConfigError, match=r"HPCRING_COLLECTIVE_TIMEOUT='-1' is out of range"):
        run_settings(args)
