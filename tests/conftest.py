"""Shared fixtures. Data builders live in tests/factories.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from stack.roles import Role
from tests.factories import make_user


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
