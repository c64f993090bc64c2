"""Debug pages and error reports never show a connection string, token or key
(stack.error_reports, settings DEFAULT_EXCEPTION_REPORTER_FILTER and DEFAULT_EXCEPTION_REPORTER)."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import RequestFactory
from django.views.debug import get_default_exception_reporter_filter, technical_500_response

from stack.error_reports import SUBSTITUTE, CredentialHidingFilter, redact_credentials

# Each appears once below, in a different place the page shows.
PASSWORDS = {
    "setting DATABASE_URL": "db-pw-1",
    "setting REDIS_URL": "redis-pw-2",
    "setting CELERY_BROKER_URL": "broker-pw-3",
    "setting with a neutral name": "neutral-pw-4",
    "environment variable in META": "env-pw-5",
    "request header": "header-pw-6",
    "frame variable (string)": "frame-pw-7",
    "frame variable (object)": "object-pw-8",
    "frame variable (named like a secret)": "named-secret-9",
    "exception message": "message-pw-10",
    "query string secret": "query-token-11",
}


def _crash(request: Any) -> Any:
    target = "postgres://app:frame-pw-7@db.internal:5432/switchyard"
    holder = SimpleNamespace(url="amqp://guest:object-pw-8@mq.internal//")
    api_token = "named-" + "secret-9"  # noqa: F841 (the page shows source lines: no literal there)
    both = (target, holder)  # noqa: F841 (in the frame for the page to show)
    try:
        raise RuntimeError(
            "could not connect to postgres://app:message-pw-10@db.internal/x "
            "(https://s3.example/obj?X-Amz-Signature=query-token-11)"
        )
    except RuntimeError:
        return technical_500_response(request, *sys.exc_info())


@pytest.fixture
def leaky_settings(settings: Any) -> None:
    settings.DEBUG = True
    settings.DATABASE_URL = "postgres://app:db-pw-1@db.internal:5432/switchyard"
    settings.REDIS_URL = "redis://:redis-pw-2@cache.internal:6379/0"
    settings.CELERY_BROKER_URL = "redis://:broker-pw-3@cache.internal:6379/0"
    settings.UPSTREAM_MIRRORS = ["https://mirror:neutral-pw-4@mirror.internal/simple"]


def _request(accept: str) -> Any:
    request = RequestFactory().get("/boom", HTTP_ACCEPT=accept, HTTP_X_UPSTREAM="https://u:header-pw-6@up/")
    # Under runserver the whole process environment is in META.
    request.META["DATABASE_URL"] = "postgres://app:env-pw-5@db.internal/switchyard"
    return request


@pytest.mark.parametrize("accept", ["text/html", "text/plain"])
def test_the_technical_500_page_shows_no_password(leaky_settings: None, accept: str) -> None:
    response = _crash(_request(accept))
    page = response.content.decode()
    assert response.status_code == 500
    assert "RuntimeError" in page  # it is the debug page, with its detail
    leaked = {where: pw for where, pw in PASSWORDS.items() if pw in page}
    assert leaked == {}
    assert "DATABASE_URL" in page and SUBSTITUTE in page  # named, value hidden
    assert "db.internal" in page  # hosts stay visible: they help debugging and are no secret


def test_the_settings_filter_hides_url_settings_and_credentials_in_any_value(leaky_settings: None) -> None:
    reporter_filter = get_default_exception_reporter_filter()
    assert isinstance(reporter_filter, CredentialHidingFilter)
    safe = reporter_filter.get_safe_settings()
    for name in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "SECRET_KEY", "CREDENTIALS_KEY"):
        assert safe[name] == SUBSTITUTE, name
    assert safe["UPSTREAM_MIRRORS"] == [f"https://{SUBSTITUTE}@mirror.internal/simple"]
    assert safe["DATABASES"]["default"]["PASSWORD"] == SUBSTITUTE


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgres://app:pw@db:5432/x", f"postgres://{SUBSTITUTE}@db:5432/x"),
        ("redis://:pw@cache:6379/0", f"redis://{SUBSTITUTE}@cache:6379/0"),
        ("see https://ghp_token@github.example/x.", f"see https://{SUBSTITUTE}@github.example/x."),
        ("https://h/p?a=1&api_key=abc&b=2", f"https://h/p?a=1&api_key={SUBSTITUTE}&b=2"),
        ("https://h/p?password=abc#frag", f"https://h/p?password={SUBSTITUTE}#frag"),
        ("http://example.com/a@b", "http://example.com/a@b"),  # an @ in the path is no userinfo
        ("mailto:ops@example.com", "mailto:ops@example.com"),
        ("file:///var/objects", "file:///var/objects"),
    ],
)
def test_redact_credentials_replaces_userinfo_and_secret_query_values(text: str, expected: str) -> None:
    assert redact_credentials(text) == expected
