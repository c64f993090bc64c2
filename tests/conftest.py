"""Shared fixtures. Data builders live in tests/factories.py.

Log users in with `client.force_login(user)` or a POST to /login/. Login throttling
(django-axes) is on in tests as everywhere: its backend refuses `client.login()`, which calls
authenticate() without a request. Failed-login counts are database rows, so every test starts
with none."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from moto.server import ThreadedMotoServer

from inference.recording import journal_folder_stop
from registry.auth.roles import Role
from tests import fast_flush
from tests.factories import make_user
from tests.helpers import FAST_PASSWORD_HASHERS
from tests.integration.postgres_server import postgres_bin_dir
from tests.migration_db import scratch_database
from tests.template_db import template_db_prepare

# What a `postgres` or `redis` test needs, and the one command that provides it. Such a test
# fails, never skips, where it is missing: `make test` always has both, and a developer without
# them says so explicitly with -m "not postgres and not redis" (README "Testing").
_NEEDS = {
    "postgres": (
        "PostgreSQL (DATABASE_URL=postgres://...)",
        "run `make test` (which provides one) or export "
        "DATABASE_URL=postgres://postgres@127.0.0.1:5432/switchyard",
    ),
    "redis": (
        "Redis (REDIS_URL=redis://...)",
        "run `make test` (which provides one) or export REDIS_URL=redis://127.0.0.1:6379/0",
    ),
    "redis_server": (
        "the redis-server program on PATH (the test starts its own)",
        "install it (apt-get install redis-server) or run `make test`",
    ),
    "postgres_server": (
        "PostgreSQL's initdb and pg_ctl (the test starts its own cluster)",
        "install them (apt-get install postgresql) or run `make test`",
    ),
}


def pytest_configure(config: pytest.Config) -> None:
    fast_flush.install()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long tests first: those that start processes or servers (`integration`), then the
    browser's, then the rest, each group in its collected order. pytest-xdist hands tests out in
    this order (`make test` passes --dist loadgroup: a worker takes a few at a time, and the
    tests of a SERIAL_GROUPS entry of tests/xdist_workers.py, the trainers, go to one worker,
    first), so the long ones start at once and the short ones fill in behind them, instead of a
    five-minute test starting when the others are nearly done."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("integration") is not None:
            return 0
        return 1 if item.get_closest_marker("browser") is not None else 2

    items.sort(key=rank)


@pytest.fixture
def scratch_db(tmp_path: Path, django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    """The alias of a new, empty database beside the test database, dropped afterwards
    (tests/migration_db.py): a data migration's test migrates it, the test database is untouched
    (and the default connection names the test database, never the configured one). A test that
    takes it needs no django_db mark."""
    with django_db_blocker.unblock(), scratch_database(tmp_path) as alias:
        yield alias


@pytest.fixture
def migrated_scratch_db(tmp_path: Path, django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    """As scratch_db, at the latest migrations."""
    with django_db_blocker.unblock(), scratch_database(tmp_path, migrated=True) as alias:
        yield alias


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """Each worker's test database (its name already suffixed for pytest-xdist) is created from
    one migrated template (tests/template_db.py) instead of being migrated again."""
    template_db_prepare()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> None:
    """pytest-django's test database, with the rows its migrations wrote remembered for the
    faster flush (tests/fast_flush.py)."""
    with django_db_blocker.unblock():
        fast_flush.remember_seeded_rows("default")


def _missing(marker: str) -> bool:
    if marker == "postgres":
        return not django_settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
    if marker == "redis":
        return not django_settings.REDIS_URL
    if marker == "postgres_server":
        return postgres_bin_dir() is None
    return shutil.which("redis-server") is None


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in _NEEDS:
        if item.get_closest_marker(marker) is not None and _missing(marker):
            what, how = _NEEDS[marker]
            pytest.fail(
                f"this test needs {what}: {how}; to leave such tests out, "
                f'deselect them with -m "not {marker}"',
                pytrace=False,
            )


@pytest.fixture(autouse=True)
def _journal_folder_stopped() -> Iterator[None]:
    """A test that journals a request starts this process's folder thread; it ends with the
    test, so that no folder outlives the database it folds into (or folds the next test's rows)."""
    yield
    journal_folder_stop()


@pytest.fixture(autouse=True)
def _fast_password_hashing(request: pytest.FixtureRequest, settings: Any) -> None:
    """PBKDF2's 10^6 rounds cost about 0.2 s per user; in-process tests never need them.

    Integration tests keep the real hasher: their users log in to separate server processes,
    which would not know MD5."""
    if request.node.get_closest_marker("integration") is None:
        settings.PASSWORD_HASHERS = FAST_PASSWORD_HASHERS


@pytest.fixture
def admin_user(db: Any) -> User:
    return make_user(Role.ADMIN)


@pytest.fixture
def operator(db: Any) -> User:
    return make_user(Role.OPERATOR)


@pytest.fixture
def viewer(db: Any) -> User:
    return make_user(Role.VIEWER)


@pytest.fixture
def auditor(db: Any) -> User:
    return make_user(Role.AUDITOR)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """A real S3 HTTP endpoint on loopback (moto's server mode); tests make their own buckets."""
    with pytest.MonkeyPatch.context() as env:
        for key, value in (
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_DEFAULT_REGION", "us-east-1"),
        ):
            env.setenv(key, value)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()
