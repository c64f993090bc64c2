"""stack/gunicorn_conf.py, the one web server configuration, read the way gunicorn reads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from gunicorn.app.wsgiapp import WSGIApplication
from gunicorn.config import Config

from bench.gateway.server import web_server_config

CONF = str(Path(settings.BASE_DIR) / "stack" / "gunicorn_conf.py")
WEB_VARIABLES = (
    "SWITCHYARD_WEB_BIND",
    "SWITCHYARD_WEB_WORKERS",
    "SWITCHYARD_WEB_THREADS",
    "SWITCHYARD_WEB_KEEPALIVE",
    "SWITCHYARD_WEB_TIMEOUT",
    "SWITCHYARD_WEB_GRACEFUL_TIMEOUT",
    "SWITCHYARD_WEB_MAX_REQUESTS",
    "DB_CONN_MAX_AGE",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in WEB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _gunicorn_config(monkeypatch: pytest.MonkeyPatch) -> Config:
    """What `gunicorn -c stack/gunicorn_conf.py stack.wsgi:application` would run with."""
    monkeypatch.setattr(sys, "argv", ["gunicorn", "-c", CONF, "stack.wsgi:application"])
    return WSGIApplication("%(prog)s [OPTIONS] [APP_MODULE]").cfg


def test_gunicorn_loads_it_as_gthread_workers_with_keep_alive_and_persistent_connections(
    clean_env: pytest.MonkeyPatch,
) -> None:
    cfg = _gunicorn_config(clean_env)
    assert cfg.worker_class_str == "gthread"
    assert cfg.workers == max(2, len(os.sched_getaffinity(0)))
    assert cfg.threads == 8
    assert cfg.keepalive == 75
    assert (cfg.timeout, cfg.graceful_timeout) == (60, 30)
    assert (cfg.max_requests, cfg.max_requests_jitter) == (0, 0)
    assert cfg.bind == ["0.0.0.0:8000"]
    # Set in the workers' environment before Django reads DB_CONN_MAX_AGE.
    assert cfg.env == {"DB_CONN_MAX_AGE": "600"}
    assert cfg.control_socket_disable is True


def test_environment_variables_size_it_and_the_bench_reports_the_same_definition(
    clean_env: pytest.MonkeyPatch,
) -> None:
    sized = {
        "SWITCHYARD_WEB_BIND": "127.0.0.1:9001",
        "SWITCHYARD_WEB_WORKERS": "3",
        "SWITCHYARD_WEB_THREADS": "4",
        "SWITCHYARD_WEB_KEEPALIVE": "5",
        "SWITCHYARD_WEB_MAX_REQUESTS": "5000",
        "DB_CONN_MAX_AGE": "0",
    }
    for name, value in sized.items():
        clean_env.setenv(name, value)
    cfg = _gunicorn_config(clean_env)
    assert (cfg.bind, cfg.workers, cfg.threads, cfg.keepalive) == (["127.0.0.1:9001"], 3, 4, 5)
    assert (cfg.max_requests, cfg.max_requests_jitter) == (5000, 500)
    assert cfg.env == {"DB_CONN_MAX_AGE": "0"}  # an explicit value is passed through

    reported = web_server_config(sized)
    assert reported == {
        "bind": "127.0.0.1:9001",
        "worker_class": cfg.worker_class_str,
        "workers": cfg.workers,
        "threads": cfg.threads,
        "keepalive": cfg.keepalive,
        "timeout": cfg.timeout,
        "graceful_timeout": cfg.graceful_timeout,
        "max_requests": cfg.max_requests,
        "max_requests_jitter": cfg.max_requests_jitter,
        "db_conn_max_age": 0,
    }


def test_a_bad_value_stops_gunicorn_with_one_line_naming_the_variable() -> None:
    env = {**os.environ, "SWITCHYARD_WEB_THREADS": "many"}
    result = subprocess.run(
        [sys.executable, "-m", "gunicorn", "--check-config", "-c", CONF, "stack.wsgi:application"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == "SWITCHYARD_WEB_THREADS must be an integer, got 'many'"
