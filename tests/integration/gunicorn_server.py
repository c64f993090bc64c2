"""gunicorn serving stack.wsgi with the production configuration (stack/gunicorn_conf.py), for the
drills that take something away under it (tests/inference/test_kill_drill.py,
tests/integration/test_restart_drills.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from bench.gateway.proc_stat import child_pids
from tests.integration.processes import wait_until
from tests.integration.redis_server import free_port

GUNICORN_CONF = Path(settings.BASE_DIR) / "stack" / "gunicorn_conf.py"


class Gateway:
    """gunicorn on a free loopback port, against `database_url` (committed rows only: a test's
    transaction is invisible to it), with `env` added to this process's environment."""

    def __init__(
        self, log: Path, *, database_url: str, workers: int, env: Mapping[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.expected_workers = workers
        child_env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "DEBUG": "0",
            "PYTHONUNBUFFERED": "1",
            "SWITCHYARD_WEB_BIND": f"127.0.0.1:{self.port}",
            "SWITCHYARD_WEB_WORKERS": str(workers),
            # Production's recording, set here for the server whatever the test settings say: answered requests are
            # journaled and folded into the ledger by each worker's folder thread.
            "SWITCHYARD_INFERENCE_RECORDING": "journal",
            "SWITCHYARD_JOURNAL_IDLE_SECONDS": "0.5",
            **(env or {}),
        }
        self.process = subprocess.Popen(  # noqa: S603 (our interpreter, fixed arguments)
            [sys.executable, "-m", "gunicorn", "-c", str(GUNICORN_CONF), "stack.wsgi:application"],
            cwd=settings.BASE_DIR,
            env=child_env,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, stopped whole in teardown
        )

    def workers(self) -> list[int]:
        return child_pids(self.process.pid)

    def healthy(self) -> bool:
        assert self.process.poll() is None, "gunicorn exited"
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as answer:  # noqa: S310 (loopback)
                return bool(answer.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@contextmanager
def gateway_running(
    log: Path, *, database_url: str, workers: int, env: Mapping[str, str] | None = None
) -> Iterator[Gateway]:
    """A Gateway answering /healthz with all its workers up; stopped on the way out (before the
    caller's database goes: the workers hold persistent connections to it)."""
    server = Gateway(log, database_url=database_url, workers=workers, env=env)
    try:
        wait_until(server.healthy, timeout=60, what="gunicorn to answer /healthz")
        wait_until(lambda: len(server.workers()) == workers, timeout=60, what="every gunicorn worker")
        yield server
    finally:
        server.stop()
