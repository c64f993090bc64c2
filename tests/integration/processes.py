"""Real processes for integration tests: `manage.py worker` / `beat` subprocesses, and polling.

They talk to the same database as the test (the test database, committed data
only: tests here use `transactional_db`) and to the configured broker (Redis in
CI, the embedded filesystem broker otherwise).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

MANAGE = str(Path(settings.BASE_DIR) / "manage.py")

# Fast health timings for the processes under test (the defaults are 5/15/30 s). A killed worker is
# still seen down within seconds, but a live one has 10 missed beats of slack before it turns
# degraded: with 3 pytest workers each running trainers on 2 cores, a heartbeat thread can be
# starved for a few seconds, and 2/4 s called live clusters degraded (placement skipped them) or
# down (their learners failed over) in CI runs.
FAST_HEALTH = {
    "SWITCHYARD_HEARTBEAT_SECONDS": "0.5",
    "SWITCHYARD_DEGRADED_AFTER_SECONDS": "5",
    "SWITCHYARD_DOWN_AFTER_SECONDS": "10",
    "SWITCHYARD_HEALTH_CHECK_SECONDS": "1",
}


def session_database_url() -> str:
    """A DATABASE_URL naming the database this test session really uses."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    if connection.vendor == "postgresql":
        auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
        return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    raise RuntimeError(f"unsupported test database vendor {connection.vendor}")


def stop_process(process: subprocess.Popen[Any], *, what: str, grace_s: float = 60.0) -> None:
    """SIGTERM a server the test started and wait for it to exit; a minute without exiting is a
    hang: it is then killed and the test fails, naming it. A slow exit is not: a process with
    torch loaded takes about 1 s to exit on a quiet machine and took over 10 s twice on the loaded
    2-core one (fresh-clone `make test`, 7 December 2026), which a 10 s wait failed."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"{what} did not stop within {grace_s:g} s of SIGTERM") from None


class Processes:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        child_env = {
            **os.environ,
            "DATABASE_URL": session_database_url(),
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "PYTHONUNBUFFERED": "1",
            **FAST_HEALTH,
            **(env or {}),
        }
        log = (self.log_dir / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [sys.executable, MANAGE, *args],
            env=child_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, killed whole in teardown
        )
        self.running[name] = process
        return process

    def kill(self, name: str) -> None:
        """SIGKILL, as a crashed machine would: no shutdown handlers run."""
        process = self.running.pop(name)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for process in self.running.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in self.running.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.running.clear()


def wait_until(
    predicate: Callable[[], Any], *, timeout: float, interval: float = 0.25, what: str = "condition"
) -> Any:
    """Poll until `predicate()` is truthy; fail with `what` after `timeout` seconds.

    The timeout is a safety net against hanging, not a performance assertion.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
