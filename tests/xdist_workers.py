"""A pytest plugin (`-p tests.xdist_workers` in pyproject's addopts) that gives each pytest-xdist
worker a Redis database of its own, as pytest-django gives each one its own test database.

It runs before Django's settings are read (a `-p` plugin is imported before pytest-django sets
Django up), so every Redis client of the worker and every process it starts (Celery workers,
servers) sees REDIS_URL's database number moved to the worker's: rate-limit windows, breaker
state, the authorisation version and the Celery broker's queues of one worker never meet
another's."""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

REDIS_DATABASES = 16  # redis-server's default `databases`


def _worker_database(url: str, worker: str) -> str:
    parts = urlsplit(url)
    index = int(worker.removeprefix("gw") or 0)
    base = int(parts.path.lstrip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{(base + 1 + index) % REDIS_DATABASES}"))


_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker:
    for _name in ("REDIS_URL", "SWITCHYARD_RATE_LIMIT_REDIS_URL", "CELERY_BROKER_URL"):
        if os.environ.get(_name, "").startswith(("redis://", "rediss://")):
            os.environ[_name] = _worker_database(os.environ[_name], _worker)
