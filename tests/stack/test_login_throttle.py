"""Login throttling (django-axes): a username is locked for one client address after too many
wrong passwords, for a cool-off that settings give; API tokens are not affected."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import time_machine
from axes.models import AccessAttempt
from django.test import Client
from django.utils import timezone

from registry.auth.roles import Role
from tests.factories import api_client, make_user

pytestmark = pytest.mark.django_db

PASSWORD = "pw-for-tests-1"
LIMIT = 3
COOLOFF = timedelta(minutes=10)


@pytest.fixture(autouse=True)
def _small_limits(settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = LIMIT
    settings.AXES_COOLOFF_TIME = COOLOFF


def _login(username: str, password: str, *, address: str = "203.0.113.7", **extra: str) -> Any:
    client = Client(REMOTE_ADDR=address, **extra)
    response = client.post("/login/", {"username": username, "password": password})
    response.logged_in = "_auth_user_id" in client.session
    return response


def _fail(username: str, times: int, *, address: str = "203.0.113.7", **extra: str) -> list[int]:
    return [_login(username, "wrong", address=address, **extra).status_code for _ in range(times)]


def test_the_right_password_is_refused_after_too_many_wrong_ones() -> None:
    make_user(Role.VIEWER, username="ops", password=PASSWORD)
    # The attempts below the limit are ordinary form errors; the one that reaches it locks.
    assert _fail("ops", LIMIT) == [200] * (LIMIT - 1) + [429]

    refused = _login("ops", PASSWORD)
    assert refused.status_code == 429
    assert not refused.logged_in
    text = refused.content.decode()
    assert 'id="locked-out"' in text
    assert "Too many failed logins for this user from your address" in text
    assert "10 minutes" in text
    assert 'name="password"' in text  # still the login page, not a bare error


def test_the_lockout_is_recorded_for_the_username_and_address_pair() -> None:
    make_user(Role.VIEWER, username="ops", password=PASSWORD)
    _fail("ops", LIMIT)
    attempt = AccessAttempt.objects.get()
    assert (attempt.username, attempt.ip_address, attempt.failures_since_start) == (
        "ops",
        "203.0.113.7",
        LIMIT,
    )
    assert PASSWORD not in attempt.post_data and "wrong" not in attempt.post_data  # passwords masked


def test_the_login_works_again_after_the_cool_off() -> None:
    make_user(Role.VIEWER, username="ops", password=PASSWORD)
    _fail("ops", LIMIT)
    assert _login("ops", PASSWORD).status_code == 429

    with time_machine.travel(timezone.now() + COOLOFF - timedelta(seconds=30), tick=False):
        assert _login("ops", PASSWORD).status_code == 429  # still inside the cool-off
    # Each refused attempt restarts the cool-off: travel past it from the last one.
    with time_machine.travel(timezone.now() + 2 * COOLOFF, tick=False):
        response = _login("ops", PASSWORD)
    assert response.status_code == 302
    assert response.logged_in


def test_the_cool_off_and_limit_come_from_settings(settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = 1
    settings.AXES_COOLOFF_TIME = timedelta(minutes=1)
    make_user(Role.VIEWER, username="ops", password=PASSWORD)
    assert _fail("ops", 1) == [429]
    assert "1 minute after" in _login("ops", PASSWORD).content.decode()
    with time_machine.travel(timezone.now() + timedelta(minutes=2), tick=False):
        assert _login("ops", PASSWORD).status_code == 302


def test_the_same_user_from_another_address_may_still_log_in() -> None:
    make_user(Role.VIEWER, username="ops", password=PASSWORD)
    _fail("ops", LIMIT, address="203.0.113.7")
    other = _login("ops", PASSWORD, address="198.51.100.20")
    assert other.status_code == 302 and other.logged_in


def test_another_user_from_the_locked_address_may_still_log_in() -> None:
    make_user(Role.VIEWER, username="ops", password=PASSWORD)
    make_user(Role.VIEWER, username="colleague", password=PASSWORD)
    _fail("ops", LIMIT)
    colleague = _login("colleague", PASSWORD)
    assert colleague.status_code == 302 and colleague.logged_in


def test_a_success_below_the_limit_clears_the_count() -> None:
    make_user(Role.VIEWER, username="ops", password=PASSWORD)
    _fail("ops", LIMIT - 1)
    assert _login("ops", PASSWORD).status_code == 302
    assert _fail("ops", LIMIT - 1) == [200] * (LIMIT - 1)
    assert _login("ops", PASSWORD).status_code == 302


def test_the_admin_login_is_throttled_too() -> None:
    from django.contrib.auth.models import User

    User.objects.create_superuser(username="root", password=PASSWORD)
    client = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(LIMIT):
        client.post("/admin/login/", {"username": "root", "password": "wrong"})
    client.post("/admin/login/", {"username": "root", "password": PASSWORD})
    assert "_auth_user_id" not in client.session


def test_api_tokens_keep_working_for_a_locked_out_user() -> None:
    user = make_user(Role.VIEWER, username="ops", password=PASSWORD)
    _fail("ops", LIMIT, address="127.0.0.1")  # the API client below comes from 127.0.0.1 too
    assert _login("ops", PASSWORD, address="127.0.0.1").status_code == 429
    response = api_client(user).get("/api/clusters/")
    assert response.status_code == 200


def test_without_trusted_proxies_a_forwarded_for_header_cannot_dodge_the_lock() -> None:
    make_user(Role.VIEWER, username="ops", password=PASSWORD)
    for i in range(LIMIT):
        _login("ops", "wrong", HTTP_X_FORWARDED_FOR=f"192.0.2.{i}")
    assert _login("ops", PASSWORD, HTTP_X_FORWARDED_FOR="192.0.2.99").status_code == 429


def test_behind_a_trusted_proxy_the_address_it_saw_is_the_one_counted(settings: Any) -> None:
    settings.SWITCHYARD_TRUSTED_PROXIES = 1
    make_user(Role.VIEWER, username="ops", password=PASSWORD)
    # The proxy (REMOTE_ADDR 10.0.0.2) appends the client's address; what the client wrote
    # itself (the left part) changes every time and must not matter.
    for i in range(LIMIT):
        _login("ops", "wrong", address="10.0.0.2", HTTP_X_FORWARDED_FOR=f"192.0.2.{i}, 203.0.113.7")
    assert AccessAttempt.objects.get().ip_address == "203.0.113.7"
    locked = _login("ops", PASSWORD, address="10.0.0.2", HTTP_X_FORWARDED_FOR="192.0.2.50, 203.0.113.7")
    assert locked.status_code == 429
    # Another client behind the same proxy is not locked.
    other = _login("ops", PASSWORD, address="10.0.0.2", HTTP_X_FORWARDED_FOR="198.51.100.20")
    assert other.status_code == 302


# Each test starts clean: attempts are database rows, rolled back with the test. These two run
# in this order; the second would be refused if the first one's lockout leaked into it.
def test_isolation_first_a_lockout() -> None:
    make_user(Role.VIEWER, username="shared-name", password=PASSWORD)
    _fail("shared-name", LIMIT, address="127.0.0.1")
    assert _login("shared-name", PASSWORD, address="127.0.0.1").status_code == 429


def test_isolation_then_the_same_login_succeeds_in_the_next_test() -> None:
    make_user(Role.VIEWER, username="shared-name", password=PASSWORD)
    assert not AccessAttempt.objects.exists()
    assert _login("shared-name", PASSWORD, address="127.0.0.1").status_code == 302
