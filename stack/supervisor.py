"""Run long-lived child processes and start again the ones that exit, with capped exponential backoff.

`manage.py demo` runs the stack (web, workers, beat) through a `Supervisor`; in production a
process manager does this job (docs/production.md, "Running in production").

Any exit of a child counts as a crash: these processes are meant to run until they are stopped.
A crashed child is started again after `RestartPolicy.initial_delay_s`, doubled for each further
crash in a row, up to `max_delay_s`; a child that had stayed up for `stable_after_s` starts a new
row at the initial delay. After `give_up_after` quick crashes in a row (each within
`stable_after_s` of its start) the child is left down: starting it again would only spin on
whatever stops it (a bad setting, a missing table). Each decision is said through `say`, naming
the process, its exit code, the restart number and the delay, and kept in `Supervisor.events`.

`poll()` does all the work and never sleeps; the caller calls it about once a second.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartPolicy:
    initial_delay_s: float = 1.0
    max_delay_s: float = 60.0
    stable_after_s: float = 60.0
    give_up_after: int = 5

    def delay(self, crashes_in_a_row: int) -> float:
        """The wait before restarting a child after its `crashes_in_a_row`-th crash in a row (1: the first)."""
        return min(self.max_delay_s, self.initial_delay_s * 2 ** max(0, crashes_in_a_row - 1))


@dataclass(frozen=True)
class Restart:
    name: str
    exit_code: int
    ran_s: float
    restart_number: int
    delay_s: float


@dataclass(frozen=True)
class GiveUp:
    name: str
    exit_code: int
    ran_s: float
    quick_crashes: int


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path | None = None
    env: Mapping[str, str] | None = None
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    crashes_in_a_row: int = 0  # since it last stayed up for stable_after_s
    quick_crashes: int = 0  # of those, the ones within stable_after_s of a start
    restart_at: float | None = None  # set while it waits out its backoff
    gave_up: bool = False
    exit_codes: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


def describe_exit(code: int) -> str:
    """`code 3`, or `signal SIGKILL` for a child killed by a signal (Popen's negative codes)."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


class Supervisor:
    def __init__(
        self,
        *,
        policy: RestartPolicy | None = None,
        say: Callable[[str], None] = logger.warning,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy or RestartPolicy()
        self.say = say
        self.clock = clock
        self.children: dict[str, Child] = {}
        self.events: list[Restart | GiveUp] = []
        self.stopping = False

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Child:
        if name in self.children:
            raise ValueError(f"a child named {name!r} is already supervised")
        child = Child(name=name, argv=list(argv), log_path=log_path, env=env)
        self.children[name] = child
        self._spawn(child)
        return child

    def _spawn(self, child: Child) -> None:
        out: IO[bytes] | int = child.log_path.open("ab") if child.log_path else subprocess.DEVNULL
        try:
            # Own session: Ctrl-C in the terminal reaches only the supervisor, which stops the
            # children itself; and a child's own children (a prefork pool) go with its group.
            child.process = subprocess.Popen(  # noqa: S603 (argv is ours, no shell)
                child.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(child.env) if child.env is not None else None,
                start_new_session=True,
            )
        finally:
            if not isinstance(out, int):
                out.close()  # the child holds its own descriptor
        child.started_at = self.clock()
        child.restart_at = None

    def poll(self) -> None:
        """Notice children that exited, and start again those whose delay is over."""
        if self.stopping:
            return
        now = self.clock()
        for child in self.children.values():
            if child.gave_up or child.process is None:
                continue
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.restarts += 1
                    self._spawn(child)
                    self.say(f"restarted {child.name} (pid {child.pid}), restart #{child.restarts}")
                continue
            code = child.process.poll()
            if code is not None:
                self._exited(child, code, now)

    def _exited(self, child: Child, code: int, now: float) -> None:
        ran = now - child.started_at
        child.exit_codes.append(code)
        if ran >= self.policy.stable_after_s:
            child.crashes_in_a_row, child.quick_crashes = 1, 0
        else:
            child.crashes_in_a_row += 1
            child.quick_crashes += 1
        log = f" (log {child.log_path})" if child.log_path else ""
        if child.quick_crashes >= self.policy.give_up_after:
            child.gave_up = True
            self.events.append(GiveUp(child.name, code, ran, child.quick_crashes))
            self.say(
                f"{child.name} exited with {describe_exit(code)} after {ran:.1f}s{log}: "
                f"{child.quick_crashes} crashes in a row, each within {self.policy.stable_after_s:g}s "
                f"of starting; giving up on it. Start it by hand with: {shlex.join(child.argv)}"
            )
            return
        delay = self.policy.delay(child.crashes_in_a_row)
        child.restart_at = now + delay
        number = child.restarts + 1
        self.events.append(Restart(child.name, code, ran, number, delay))
        self.say(
            f"{child.name} exited with {describe_exit(code)} after {ran:.1f}s{log}; "
            f"restart #{number} in {delay:g}s"
        )

    def stop_all(self, *, timeout_s: float = 15.0) -> list[str]:
        """SIGTERM every running child's process group, SIGKILL what is left after `timeout_s`.

        No restarts after this. Returns the names of the children that were running.
        """
        self.stopping = True
        running = {c.name: c.process for c in self.children.values() if c.process and c.running}
        for process in running.values():
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in running.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        return list(running)


def _signal_group(process: subprocess.Popen[bytes], signum: signal.Signals) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass  # gone already
