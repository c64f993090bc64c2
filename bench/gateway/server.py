"""The gateway under gunicorn for `bench gateway`: starting it with the shipped configuration
(stack/gunicorn_conf.py), the CPU its processes and the database's spend per request
(from /proc, bench.gateway.proc_stat), and requests per second from concurrent clients."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from bench.gateway.client import BODY, Client
from bench.gateway.proc_stat import ProcStat, all_processes, ticks_to_ms, tree_cpu_ticks
from inference.recording import journal_pending_count


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


GUNICORN_CONF = Path(settings.BASE_DIR) / "stack" / "gunicorn_conf.py"


def web_server_config(environ: Mapping[str, str]) -> dict[str, Any]:
    """stack/gunicorn_conf.py's definition for `environ`, loaded by path as gunicorn loads it
    (it is the composition's file; the bench reads it, it does not import the stack)."""
    spec = importlib.util.spec_from_file_location("switchyard_gunicorn_conf", GUNICORN_CONF)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {GUNICORN_CONF}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as gunicorn does: its dataclass looks itself up there
    spec.loader.exec_module(module)
    return asdict(module.web_server(environ=environ))


def gunicorn_env(port: int, workers: int | None, threads: int | None) -> dict[str, str]:
    env = {**os.environ, "DEBUG": "0", "PYTHONUNBUFFERED": "1", "SWITCHYARD_WEB_BIND": f"127.0.0.1:{port}"}
    if workers is not None:
        env["SWITCHYARD_WEB_WORKERS"] = str(workers)
    if threads is not None:
        env["SWITCHYARD_WEB_THREADS"] = str(threads)
    return env


SERVERS = ("gunicorn", "granian")


def gunicorn_start(port: int, env: dict[str, str], server: str = "gunicorn") -> subprocess.Popen[bytes]:
    """The web server on `port`: gunicorn with stack/gunicorn_conf.py, or (``server="granian"``,
    a comparison, not what ships) granian's WSGI server given the same sizing from that file's
    definition: its workers, a blocking thread per gunicorn thread, and the same database
    connection lifetime and metrics directory."""
    args = [sys.executable, "-m", "gunicorn", "-c", str(GUNICORN_CONF), "stack.wsgi:application"]
    if server == "granian":
        cfg = web_server_config(env)
        metrics_dir = tempfile.mkdtemp(prefix="switchyard-bench-metrics-")
        env = {**env, "DB_CONN_MAX_AGE": str(cfg["db_conn_max_age"]), "PROMETHEUS_MULTIPROC_DIR": metrics_dir}
        args = [
            sys.executable,
            "-m",
            "granian",
            "--interface",
            "wsgi",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        args += ["--workers", str(cfg["workers"]), "--blocking-threads", str(cfg["threads"])]
        args += ["--log-level", "warning", "--no-ws", "stack.wsgi:application"]
    process = subprocess.Popen(  # noqa: S603 (our own interpreter and fixed arguments)
        args, env=env, cwd=str(Path(settings.BASE_DIR)), start_new_session=True
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return process
        except OSError:
            if process.poll() is not None:
                raise RuntimeError("gunicorn exited at start") from None
            time.sleep(0.2)
    raise RuntimeError("gunicorn did not start")


def other_databases_pids() -> set[int]:
    """PostgreSQL processes working for other databases on a shared server (their backends,
    autovacuum workers); the server's own processes have no database."""
    if connection.vendor != "postgresql":
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname IS NOT NULL AND datname <> current_database()"
        )
        return {int(row[0]) for row in cursor.fetchall()}


def _roots(processes: list[ProcStat], name: str) -> list[int]:
    """The processes called `name` whose parent is not: a server's main process."""
    pids = {p.pid for p in processes if p.name == name}
    return [p.pid for p in processes if p.name == name and p.ppid not in pids]


def cpu_snapshot(gunicorn_pid: int) -> dict[str, Any]:
    processes = all_processes()
    return {
        "web": tree_cpu_ticks(gunicorn_pid, processes),
        # Per process, own time only: a backend of ours lives through the block (persistent
        # connections), and the postmaster's reaped children include other databases' ones.
        "postgres": {p.pid: p.own_ticks for p in processes if p.name == "postgres"},
        "postgres_all": sum(tree_cpu_ticks(pid, processes) for pid in _roots(processes, "postgres")),
        "redis": sum(tree_cpu_ticks(pid, processes) for pid in _roots(processes, "redis-server")),
        "other_databases": other_databases_pids(),
        "seen": {name: bool(_roots(processes, name)) for name in ("postgres", "redis-server")},
    }


def cpu_per_request(before: dict[str, Any], after: dict[str, Any], requests: int) -> dict[str, Any]:
    """CPU ms per request over the block, by part (None for a part not on this machine)."""
    others = before["other_databases"] | after["other_databases"]
    postgres = sum(
        ticks - before["postgres"].get(pid, 0)
        for pid, ticks in after["postgres"].items()
        if pid not in others
    )
    seen = after["seen"]
    parts = {
        "web": after["web"] - before["web"],
        "postgres": postgres if seen["postgres"] else None,
        "redis": after["redis"] - before["redis"] if seen["redis-server"] else None,
        "postgres_all": after["postgres_all"] - before["postgres_all"] if seen["postgres"] else None,
    }
    per = {k: None if v is None else ticks_to_ms(v) / max(1, requests) for k, v in parts.items()}
    out = {f"gateway_cpu_ms_per_request_{k}": v for k, v in per.items()}
    out["gateway_cpu_ms_per_request"] = sum(per[k] or 0.0 for k in ("web", "postgres", "redis"))
    return out


def requests_per_second(
    port: int, token: str | None, workflow: str, *, clients: int, seconds: float
) -> tuple[int, int, float]:
    """(answered, errors, seconds) for `clients` keep-alive clients sending for `seconds`;
    without a token, as a caller of the provider itself (the mock) would."""
    stop = time.monotonic() + seconds
    counts = [0] * clients
    errors = [0] * clients
    body = {**BODY, "model": workflow}
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    def loop(i: int) -> None:
        client = Client(port, "/v1/chat/completions", headers)
        while time.monotonic() < stop:
            status, _ = client.post(body)
            if status == 200:
                counts[i] += 1
            else:
                errors[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts), sum(errors), time.monotonic() - started


def journal_backlog(port: int, token: str, workflow: str, *, seconds: float) -> dict[str, Any]:
    """16 clients for `seconds` while the journal's pending rows are counted every second."""
    samples: list[int] = []
    stop = threading.Event()

    def count() -> None:
        try:
            while not stop.wait(1.0):
                samples.append(journal_pending_count())
        finally:
            connection.close()  # this thread's own connection

    sampler = threading.Thread(target=count, daemon=True)
    sampler.start()
    answered, errors, took = requests_per_second(port, token, workflow, clients=16, seconds=seconds)
    stop.set()
    sampler.join(timeout=10)
    third = max(1, len(samples) // 3)
    return {
        "journal_backlog_seconds": seconds,
        "journal_backlog_rps": answered / took,
        "journal_backlog_errors": errors,
        "journal_backlog_after_60s_at_rps16": samples[-1] if samples else None,
        "journal_backlog_max_at_rps16": max(samples, default=None),
        "journal_backlog_first_third_max": max(samples[:third], default=None),
        "journal_backlog_last_third_max": max(samples[-third:], default=None),
        "journal_backlog_samples": samples,
    }
