"""A pytest plugin (`-p tests.xdist_workers` in pyproject's addopts) that gives each pytest-xdist
worker a Redis database of its own, as pytest-django gives each one its own test database.

It runs before Django's settings are read (a `-p` plugin is imported before pytest-django sets
Django up), so every Redis client of the worker and every process it starts (Celery workers,
servers) sees REDIS_URL's database number moved to the worker's: rate-limit windows, breaker
state, the authorisation version and the Celery broker's queues of one worker never meet
another's.

It also schedules (`make test` passes --dist loadgroup): the modules of a SERIAL_GROUPS entry
go, as one unit of work, to one worker, which runs them one after another while the other
workers take the rest test by test. The trainers each start several processes that train on
the machine's cores; three at once on 2 cores starved those processes' heartbeats long enough
for live clusters to be called degraded or down (CI, 6 December 2026). pytest-xdist's own
`xdist_group` marker does not work with pytest 9 (xdist 3.8 renames a node id pytest 9 no
longer reads), so the groups are named here by module path, on the controller.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

SERIAL_GROUPS = {
    "trainers": (
        "tests/integration/test_training_run.py",
        "tests/integration/test_training_byo_e2e.py",
        "tests/integration/test_demo_e2e.py",
    ),
}

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


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # a hook of pytest-xdist's
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With --dist loadgroup: each SERIAL_GROUPS entry is one unit of work, every other test its
    own (pytest-xdist hands the largest units out first, so the group starts at once)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling  # noqa: PLC0415 (only with pytest-xdist running)

    class _SerialGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return next((name for name, paths in SERIAL_GROUPS.items() if path in paths), nodeid)

    return _SerialGroups(config, log)
