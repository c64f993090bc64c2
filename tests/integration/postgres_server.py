"""A private PostgreSQL cluster for tests that take the database away: initdb into a temporary
directory, its own free port, trust authentication, stopped and started with pg_ctl.

Never the shared PostgreSQL (DATABASE_URL / port 5432): other test sessions use that one.
PostgreSQL's programs refuse to run as root, so as root they run as the `postgres` user
(Debian's packages create it), which then owns the cluster's directory.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connections

from tests.integration.redis_server import free_port

MANAGE = str(Path(settings.BASE_DIR) / "manage.py")
RUN_AS = "postgres"  # as root only


def postgres_bin_dir() -> Path | None:
    """Where initdb and pg_ctl are: Debian's newest /usr/lib/postgresql/<version>/bin, else PATH;
    None without them (or, as root, without the `postgres` user to run them as)."""
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(RUN_AS)
        except KeyError:
            return None
    debian = [Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    if debian:
        return max(debian, key=lambda d: tuple(int(n) for n in d.parent.name.split(".") if n.isdigit()))
    found = shutil.which("initdb")
    return Path(found).parent if found else None


class PostgresServer:
    """One cluster (database `postgres`, user `postgres`, no password) on 127.0.0.1:<port>."""

    def __init__(self) -> None:
        bin_dir = postgres_bin_dir()
        assert bin_dir is not None, "initdb and pg_ctl are not installed"  # noqa: S101 (the marker's check)
        self.bin_dir = bin_dir
        self.port = free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"
        # Not under pytest's tmp_path: its parents are private to root, and the server runs as `postgres`.
        self.dir = Path(tempfile.mkdtemp(prefix="switchyard-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"
        self._as_root = os.geteuid() == 0
        if self._as_root:
            shutil.chown(self.dir, user=RUN_AS)

    def _run(self, program: str, *args: str) -> None:
        argv = [str(self.bin_dir / program), *args]
        if self._as_root:
            argv = ["runuser", "-u", RUN_AS, "--", *argv]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)  # noqa: S603 (fixed programs)

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")

    def start(self) -> None:
        """Start it and return once it accepts connections (pg_ctl -w)."""
        # fsync off: the drills stop it cleanly (a checkpoint first) and never crash the machine,
        # so nothing is lost, and the shared disk is spared.
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c fsync=off"
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start"
        )

    def stop(self) -> None:
        """Stop it as `systemctl restart postgresql` does: fast mode (sessions are ended, their
        transactions rolled back, a checkpoint written)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def migrate(self) -> None:
        env = {**os.environ, "DATABASE_URL": self.url}
        subprocess.run(  # noqa: S603 (our interpreter, fixed arguments)
            [sys.executable, MANAGE, "migrate", "--noinput", "-v", "0"],
            check=True,
            env=env,
            cwd=settings.BASE_DIR,
            timeout=300,
        )

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """A migrated private cluster, running; destroyed on the way out."""
    server = PostgresServer()
    try:
        server.init()
        server.start()
        server.migrate()
        yield server
    finally:
        server.destroy()


@contextmanager
def default_database_at(server: PostgresServer, django_db_blocker: Any) -> Iterator[None]:
    """This process's `default` connection pointed at `server` (for the test's own setup and
    checks), and back at the test database afterwards. Django's wrappers share one settings
    dict per alias, so every thread's next connection goes there."""
    connection = connections["default"]
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict.update(
        NAME="postgres", USER="postgres", PASSWORD="", HOST="127.0.0.1", PORT=str(server.port)
    )
    try:
        with django_db_blocker.unblock():
            yield
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
