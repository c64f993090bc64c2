"""The web server's production configuration: the one definition that the Dockerfile,
docker-compose.yml, the systemd unit of docs/production.md and `manage.py bench gateway` all run.

    gunicorn -c stack/gunicorn_conf.py stack.wsgi:application

gunicorn executes this file by path (`-c`), so it imports only the standard library: it must
load before Django and before the project is on sys.path. `web_server(environ=...)` is the
definition; the module-level names below are what gunicorn reads; the bench loads this file the
same way and reports `web_server(...)` for the environment it gave gunicorn.

Why these values (gunicorn's "Design" and "Settings" pages):
- gthread workers: a request spends most of its time waiting on PostgreSQL, Redis and the
  provider, so threads overlap those waits; one process per core uses the cores.
- keep-alive: OpenAI SDK clients and reverse proxies reuse connections; a new TCP connection
  per request costs more than the gateway's own work. Idle keep-alive connections wait in the
  worker's poller, not in a thread. The default outlasts the common load balancers' idle
  timeout (60 s), so the balancer, not gunicorn, closes idle connections (no 502 races).
- DB_CONN_MAX_AGE: each thread keeps its PostgreSQL connection (Django's connections are per
  thread), so there are workers x threads connections per web server; opening one costs
  several ms of PostgreSQL CPU per request otherwise. settings.py turns CONN_HEALTH_CHECKS on,
  so a connection the database dropped is replaced before a request uses it.
- max_requests stays off by default: recycling a worker drops its keep-alive connections and
  costs a Django start-up; set SWITCHYARD_WEB_MAX_REQUESTS if a leak ever needs containing
  (a jitter of 10% of it keeps the workers from restarting together).
- /metrics under several workers: prometheus-client's multiprocess mode. Each worker writes its
  counters and histograms to files in PROMETHEUS_MULTIPROC_DIR and a scrape of any worker sums
  them (stack.metrics). The hooks below give the master a fresh directory before it forks (an
  operator's own directory is emptied of old files: a reused pid would add to a dead worker's
  values), and tell prometheus-client when a worker exits.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class WebServer:
    bind: str
    worker_class: str
    workers: int
    threads: int
    keepalive: int
    timeout: int
    graceful_timeout: int
    max_requests: int
    max_requests_jitter: int
    db_conn_max_age: int


def _int(environ: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SystemExit(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise SystemExit(f"{name} must be >= {minimum}, got {value}")
    return value


def _cpus() -> int:
    # The CPUs this process may run on (a cpuset-limited container sees its share).
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def web_server(*, environ: Mapping[str, str]) -> WebServer:
    """The configuration for this environment: SWITCHYARD_WEB_* override the sized defaults."""
    bind = environ.get("SWITCHYARD_WEB_BIND") or "0.0.0.0:8000"  # noqa: S104 (a container's port)
    max_requests = _int(environ, "SWITCHYARD_WEB_MAX_REQUESTS", 0, minimum=0)
    return WebServer(
        bind=bind,
        worker_class="gthread",
        workers=_int(environ, "SWITCHYARD_WEB_WORKERS", max(2, _cpus()), minimum=1),
        threads=_int(environ, "SWITCHYARD_WEB_THREADS", 8, minimum=1),
        keepalive=_int(environ, "SWITCHYARD_WEB_KEEPALIVE", 75, minimum=0),
        timeout=_int(environ, "SWITCHYARD_WEB_TIMEOUT", 60, minimum=1),
        graceful_timeout=_int(environ, "SWITCHYARD_WEB_GRACEFUL_TIMEOUT", 30, minimum=0),
        max_requests=max_requests,
        max_requests_jitter=max_requests // 10,
        db_conn_max_age=_int(environ, "DB_CONN_MAX_AGE", 600, minimum=0),
    )


_server = web_server(environ=os.environ)

# --- What gunicorn reads -------------------------------------------------------------------------
bind = [_server.bind]
worker_class = _server.worker_class
workers = _server.workers
threads = _server.threads
keepalive = _server.keepalive
timeout = _server.timeout
graceful_timeout = _server.graceful_timeout
max_requests = _server.max_requests
max_requests_jitter = _server.max_requests_jitter
# Set in the workers' environment before Django reads its settings (an explicit
# DB_CONN_MAX_AGE, such as 0, is passed through unchanged).
raw_env = [f"DB_CONN_MAX_AGE={_server.db_conn_max_age}"]
# gunicorn 27 opens a control socket for `gunicornc` (resize, reload) at one per-user path:
# two servers on one host would share it, and nothing here uses it.
control_socket_disable = True
# The workers' heartbeat files on tmpfs: a container's overlay filesystem can stall the
# heartbeat's fchmod and get healthy workers killed (gunicorn's FAQ, "Blocking OS calls").
# gunicorn makes each file there with mkstemp and unlinks it at once.
_TMPFS = "/dev/shm"  # noqa: S108
if os.path.isdir(_TMPFS):
    worker_tmp_dir = _TMPFS


# --- Prometheus multiprocess mode (see the docstring) -------------------------------------------
_MULTIPROC = "PROMETHEUS_MULTIPROC_DIR"
_made_multiproc_dir = ""


def on_starting(server: object) -> None:
    """Before any worker exists: the directory every worker writes its metric values to."""
    global _made_multiproc_dir
    path = os.environ.get(_MULTIPROC, "")
    if path:
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(path):
            if name.endswith(".db"):
                os.remove(os.path.join(path, name))
    else:
        parent = _TMPFS if os.path.isdir(_TMPFS) else None
        path = _made_multiproc_dir = tempfile.mkdtemp(prefix="switchyard-metrics-", dir=parent)
    # Set in the master, so the workers it forks inherit it before Django imports
    # prometheus-client (which picks its storage from this variable when it is imported).
    os.environ[_MULTIPROC] = path


def child_exit(server: object, worker: object) -> None:
    """A worker exited: its live gauges go; its counters and histograms stay counted."""
    from prometheus_client import multiprocess  # installed with the app; gunicorn loads this file first

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[attr-defined]


def on_exit(server: object) -> None:
    if _made_multiproc_dir:
        shutil.rmtree(_made_multiproc_dir, ignore_errors=True)
