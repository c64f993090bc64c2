"""A private `redis-server` for tests that take the broker away: its own free port, no persistence.

Never the shared Redis (REDIS_URL / port 6379): other test sessions use that one.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from tests.integration.processes import wait_until

REDIS_SERVER = shutil.which("redis-server") or "redis-server"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisServer:
    """`redis-server --port N --save "" --appendonly no`, killed and started again on the same port."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log = log_dir / "redis-server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        argv = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.starts += 1
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        wait_until(self._answers(client), timeout=30, interval=0.05, what=f"redis-server on {self.port}")
        client.close()

    @staticmethod
    def _answers(client: redis.Redis) -> object:
        def ping() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        return ping

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill would: without persistence every key is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def restart(self, *, down_s: float) -> None:
        """Kill it, leave it down for `down_s` (clients see refused connections), start it again."""
        self.kill()
        time.sleep(down_s)
        self.start()


@contextmanager
def redis_server(log_dir: Path) -> Iterator[RedisServer]:
    server = RedisServer(log_dir)
    server.start()
    try:
        yield server
    finally:
        server.kill()
