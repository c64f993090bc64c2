"""/v1 answers every failure in the OpenAI error shape: size limit, unknown paths, wrong methods,
bodies that are not JSON objects, Django's own error pages and unexpected exceptions."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.test import Client, RequestFactory

from bench.mockprovider import MockProviderServer
from inference.gateway import caller as gateway_caller
from inference.gateway import middleware as gateway_middleware
from inference.gateway import views as gateway
from inference.gateway.middleware import GatewayErrorsMiddleware
from inference.models import InferenceRequest
from registry.services import api_token_create
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db


def _client(user: User) -> Client:
    _, raw = api_token_create(user=user, name="gateway")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def _openai_error(response: Any, status: int) -> dict[str, Any]:
    """The error object of an OpenAI-style error answer (asserting the whole shape)."""
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/json"
    error = json.loads(response.content)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    return error


def test_a_body_over_the_size_limit_is_413(
    viewer: User, mock_provider: Callable[..., MockProviderServer], settings: Any
) -> None:
    settings.V1_MAX_BODY_BYTES = 1_000_000
    server = mock_provider()
    workflow = routed_workflow(viewer, [priced_deployment(server)])
    big = json.dumps({"model": workflow.slug, "messages": [{"role": "user", "content": "x" * 1_000_000}]})
    response = _client(viewer).post("/v1/chat/completions", big, content_type="application/json")
    error = _openai_error(response, 413)
    assert error["code"] == "request_too_large" and error["type"] == "invalid_request_error"
    assert "1000000" in error["message"]
    assert not response.has_header("Connection")  # hop-by-hop: no WSGI application may set it
    assert server.behaviour.total_calls() == 0 and not InferenceRequest.objects.exists()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/v1/nope"),
        ("post", "/v1/audio/speech"),
        ("get", "/v1"),
        ("post", "/v1/"),
        ("post", "/v1/chat/completions/"),
        ("get", "/v1/models/some-workflow"),
    ],
)
def test_unknown_v1_paths_are_a_json_404(viewer: User, method: str, path: str) -> None:
    response = _client(viewer).generic(method.upper(), path, b"{}", content_type="application/json")
    error = _openai_error(response, 404)
    assert error["code"] == "unknown_url"
    assert error["message"] == f"Invalid URL ({method.upper()} {path})"


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("post", "/v1/models", "GET"),
        ("delete", "/v1/models", "GET"),
        ("get", "/v1/chat/completions", "POST"),
        ("put", "/v1/completions", "POST"),
    ],
)
def test_wrong_methods_are_a_json_405(viewer: User, method: str, path: str, allow: str) -> None:
    # A session cookie would make Django's CSRF check answer 403 HTML before the view: the
    # gateway takes bearer tokens only, so it is exempt and the view answers 405.
    client = _client(viewer)
    client.force_login(viewer)
    client.handler.enforce_csrf_checks = True
    response = client.generic(method.upper(), path, b"{}", content_type="application/json")
    error = _openai_error(response, 405)
    assert error["code"] == "method_not_allowed" and response["Allow"] == allow


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"", "must be a JSON object"),
        (b"[1, 2]", "must be a JSON object"),
        (b'"a string"', "must be a JSON object"),
        (b'{"model": "w", "temperature": NaN}', "not valid JSON"),
        (b'{"model": "w", "x": Infinity}', "not valid JSON"),
        (b'{"model": "caf\xe9"}', "not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested more than"),
        (b'{"model": "w", "x": ' + b"[" * 40 + b"]" * 40 + b"}", "nested more than"),
        (b'{"model": "w", "x": 1e999}', "out of range"),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_bodies_that_are_not_json_objects_are_400(viewer: User, path: str, body: bytes, message: str) -> None:
    response = _client(viewer).post(path, body, content_type="application/json")
    error = _openai_error(response, 400)
    assert message in error["message"] and error["type"] == "invalid_request_error"


def test_djangos_own_400_under_v1_is_json_and_other_paths_are_untouched(viewer: User) -> None:
    # An unknown Host header: Django's SuspiciousOperation page (400) before any view runs.
    response = Client(HTTP_HOST="evil.invalid").get("/v1/models")
    error = _openai_error(response, 400)
    assert error["code"] == "bad_request"
    elsewhere = Client().get("/no-such-page/")
    assert elsewhere.status_code == 404 and not elsewhere["Content-Type"].startswith("application/json")


def test_an_unexpected_exception_is_a_json_500_and_is_logged(
    viewer: User, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(request: HttpRequest) -> Any:
        raise RuntimeError("secret internals")

    # Both paths to the caller's grant (the views' own and the deferred one in caller) break.
    monkeypatch.setattr(gateway, "caller_grant", broken)
    monkeypatch.setattr(gateway_caller, "caller_grant", broken)
    with caplog.at_level(logging.ERROR, logger="inference.gateway.middleware"):
        response = _client(viewer).post("/v1/completions", "{}", content_type="application/json")
    error = _openai_error(response, 500)
    assert error["type"] == "api_error" and "secret" not in error["message"]
    assert any("secret internals" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


@pytest.mark.parametrize(
    "lost",
    [
        OperationalError('connection failed: connection to server at "127.0.0.1", port 5432 failed'),
        InterfaceError("connection already closed"),
    ],
)
def test_a_database_that_is_down_is_a_json_503_to_retry(
    viewer: User, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, lost: Exception
) -> None:
    def unreachable(request: HttpRequest) -> Any:
        raise lost

    client = _client(viewer)
    monkeypatch.setattr(gateway, "caller_grant", unreachable)
    monkeypatch.setattr(gateway_caller, "caller_grant", unreachable)
    monkeypatch.setattr(gateway_middleware, "_database_warned_at", 0.0)
    with caplog.at_level(logging.WARNING, logger="inference.gateway.middleware"):
        first = client.post("/v1/chat/completions", "{}", content_type="application/json")
        second = client.post("/v1/chat/completions", "{}", content_type="application/json")
    for response in (first, second):
        error = _openai_error(response, 503)
        assert (error["type"], error["code"]) == ("api_error", "database_unavailable")
        assert response["Retry-After"] == "1"
    # An outage under traffic is one warning now and then, not a traceback per request.
    warnings = [r for r in caplog.records if r.name == "inference.gateway.middleware"]
    assert [r.levelno for r in warnings] == [logging.WARNING]
    assert type(lost).__name__ in warnings[0].getMessage()


def test_any_html_error_page_under_v1_is_rewritten_with_its_status() -> None:
    def forbidden(request: HttpRequest) -> HttpResponse:
        return HttpResponseForbidden("<h1>CSRF verification failed</h1>")

    middleware = GatewayErrorsMiddleware(forbidden)
    response = middleware(RequestFactory().post("/v1/models"))
    assert response.status_code == 403
    assert json.loads(response.content)["error"]["type"] == "permission_error"
    untouched = middleware(RequestFactory().post("/api/models/"))
    assert untouched.content == b"<h1>CSRF verification failed</h1>"


def test_a_content_length_that_is_no_length_is_400(viewer: User) -> None:
    response = _client(viewer).generic(
        "POST", "/v1/completions", b"{}", content_type="application/json", CONTENT_LENGTH="twelve"
    )
    assert _openai_error(response, 400)["message"] == "Content-Length is not a length"
