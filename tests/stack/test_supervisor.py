"""The supervisor behind `manage.py demo`, with real short-lived child processes."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stack.supervisor import GiveUp, Restart, RestartPolicy, Supervisor, describe_exit
from tests.integration.processes import wait_until

EXIT_3 = [sys.executable, "-c", "import sys; sys.exit(3)"]
SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def _supervisor(said: list[str], **policy: Any) -> Supervisor:
    return Supervisor(policy=RestartPolicy(**policy), say=said.append)


def _poll_until(supervisor: Supervisor, done: Callable[[], object], *, what: str) -> None:
    def step() -> bool:
        supervisor.poll()
        return bool(done())

    wait_until(step, timeout=30, interval=0.01, what=what)


@pytest.fixture
def stop() -> Iterator[list[Supervisor]]:
    """Supervisors to stop after the test, whatever it asserted."""
    made: list[Supervisor] = []
    yield made
    for supervisor in made:
        supervisor.stop_all(timeout_s=5)


def test_the_delay_doubles_per_crash_in_a_row_up_to_the_cap() -> None:
    policy = RestartPolicy(initial_delay_s=1, max_delay_s=8)
    assert [policy.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 8, 8]


def test_a_crashed_child_is_started_again_after_the_delay_and_the_supervisor_says_so(
    tmp_path: Path, stop: list[Supervisor]
) -> None:
    said: list[str] = []
    supervisor = _supervisor(said, initial_delay_s=0.05, stable_after_s=30, give_up_after=10)
    stop.append(supervisor)
    child = supervisor.start("worker-a", EXIT_3, log_path=tmp_path / "worker-a.log")
    first_pid = child.pid

    _poll_until(supervisor, lambda: child.restarts >= 1, what="the first restart")

    assert child.pid != first_pid
    assert supervisor.events[0] == Restart("worker-a", 3, supervisor.events[0].ran_s, 1, 0.05)
    assert said[0].startswith("worker-a exited with code 3 after ")
    assert said[0].endswith(f"(log {tmp_path / 'worker-a.log'}); restart #1 in 0.05s")
    assert said[1] == f"restarted worker-a (pid {child.pid}), restart #1"


def test_a_child_that_keeps_crashing_quickly_is_given_up_after_growing_delays(stop: list[Supervisor]) -> None:
    said: list[str] = []
    supervisor = _supervisor(said, initial_delay_s=0.02, max_delay_s=0.05, stable_after_s=30, give_up_after=4)
    stop.append(supervisor)
    child = supervisor.start("beat", EXIT_3)

    _poll_until(supervisor, lambda: child.gave_up, what="the supervisor to give up")

    restarts = [e for e in supervisor.events if isinstance(e, Restart)]
    assert [(e.restart_number, e.delay_s) for e in restarts] == [(1, 0.02), (2, 0.04), (3, 0.05)]
    assert supervisor.events[-1] == GiveUp("beat", 3, supervisor.events[-1].ran_s, 4)
    assert child.restarts == 3 and child.exit_codes == [3, 3, 3, 3]
    assert "4 crashes in a row, each within 30s of starting; giving up on it." in said[-1]
    assert said[-1].endswith(f"Start it by hand with: {sys.executable} -c 'import sys; sys.exit(3)'")
    # Given up means left alone.
    time.sleep(0.1)
    supervisor.poll()
    assert child.restarts == 3 and not child.running


def test_a_child_that_ran_long_enough_starts_over_at_the_initial_delay(
    tmp_path: Path, stop: list[Supervisor]
) -> None:
    # Crashes at once twice, then runs past `stable_after_s` before it crashes again.
    runs = tmp_path / "runs"
    script = (
        "import pathlib, sys, time\n"
        f"runs = pathlib.Path({str(runs)!r})\n"
        "n = len(runs.read_text()) if runs.exists() else 0\n"
        "runs.write_text('x' * (n + 1))\n"
        "time.sleep(1.5 if n == 2 else 0)\n"
        "sys.exit(1)\n"
    )
    said: list[str] = []
    supervisor = _supervisor(said, initial_delay_s=0.05, stable_after_s=1.0, give_up_after=3)
    stop.append(supervisor)
    child = supervisor.start("control", [sys.executable, "-c", script])

    _poll_until(supervisor, lambda: len(supervisor.events) >= 3, what="three exits")

    delays = [e.delay_s for e in supervisor.events if isinstance(e, Restart)]
    assert delays == [0.05, 0.1, 0.05]  # the third exit came after a stable run: a new row
    assert not child.gave_up and (child.crashes_in_a_row, child.quick_crashes) == (1, 0)


def test_a_child_killed_by_a_signal_is_named_by_its_signal(stop: list[Supervisor]) -> None:
    said: list[str] = []
    supervisor = _supervisor(said, initial_delay_s=0.05)
    stop.append(supervisor)
    child = supervisor.start("worker-b", SLEEP)
    assert child.process is not None
    child.process.send_signal(signal.SIGKILL)

    _poll_until(supervisor, lambda: child.restarts >= 1, what="the restart after SIGKILL")

    assert said[0].startswith("worker-b exited with signal SIGKILL after ")
    assert describe_exit(-15) == "signal SIGTERM" and describe_exit(0) == "code 0"


def test_stop_all_terminates_every_child_and_restarts_nothing(tmp_path: Path) -> None:
    said: list[str] = []
    supervisor = _supervisor(said, initial_delay_s=0.01)
    polite = supervisor.start("web", SLEEP)
    # One that ignores SIGTERM, as a wedged process would: killed once the timeout is over.
    stubborn_log = tmp_path / "stubborn.log"
    stubborn = supervisor.start(
        "stubborn",
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)",
        ],
        log_path=stubborn_log,
    )
    wait_until(lambda: "ready" in stubborn_log.read_text(), timeout=30, what="the stubborn child to start")

    stopped = supervisor.stop_all(timeout_s=0.5)

    assert stopped == ["web", "stubborn"]
    assert polite.process is not None and polite.process.returncode == -signal.SIGTERM
    assert stubborn.process is not None and stubborn.process.returncode == -signal.SIGKILL
    supervisor.poll()
    assert polite.restarts == stubborn.restarts == 0 and said == []
