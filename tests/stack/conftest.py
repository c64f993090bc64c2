"""Fixtures for the fast in-process tests of this folder."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    # PBKDF2's 10^6 rounds cost ~0.2 s per user; these tests never need them.
    # Only in-process tests here: a separate server process would not know MD5.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
