"""Shared fixtures. Data builders live in tests/factories.py.

Log users in with `client.force_login(user)` or a POST to /login/. Login throttling
(django-axes) is on in tests as everywhere: its backend refuses `client.login()`, which calls
authenticate() without a request. Failed-login counts are database rows, so every test starts
with none."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from moto.server import ThreadedMotoServer

from stack.registry.roles import Role
from tests.factories import make_user


@pytest.fixture(autouse=True)
def _fast_password_hashing(request: pytest.FixtureRequest, settings: Any) -> None:
    """PBKDF2's 10^6 rounds cost about 0.2 s per user; in-process tests never need them.

    Integration tests keep the real hasher: their users log in to separate server processes,
    which would not know MD5."""
    if request.node.get_closest_marker("integration") is None:
        settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


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
