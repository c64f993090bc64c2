"""stack.wsgi sends /v1 to the data plane's short middleware chain and the rest to Django's full one.

The calls go through stack.wsgi.application itself (what gunicorn serves), on a committed database
(its request_finished closes connections, which a test transaction would not survive).
"""

from __future__ import annotations

import io
import json
from typing import Any
from wsgiref.util import setup_testing_defaults

import pytest

from registry.auth.roles import Role
from registry.services import api_token_create
from stack.wsgi import application
from tests.factories import make_deployment, make_user, make_workflow

pytestmark = pytest.mark.django_db(transaction=True)


def _call(
    path: str, *, method: str = "GET", host: str = "localhost", body: bytes = b"", **headers: str
) -> tuple[int, dict[str, str], bytes]:
    environ: dict[str, Any] = {
        "PATH_INFO": path,
        "REQUEST_METHOD": method,
        "HTTP_HOST": host,
        "SERVER_NAME": host,
    }
    setup_testing_defaults(environ)
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = headers.pop("content_length", str(len(body)))
    environ["CONTENT_TYPE"] = "application/json"
    environ.update({f"HTTP_{k.upper()}": v for k, v in headers.items()})
    answer: dict[str, Any] = {}

    def start_response(status: str, header_list: list[tuple[str, str]], exc_info: Any = None) -> None:
        answer["status"] = int(status.split()[0])
        answer["headers"] = {k.lower(): v for k, v in header_list}

    chunks = application(environ, start_response)
    try:
        content = b"".join(chunks)
    finally:
        getattr(chunks, "close", lambda: None)()
    return answer["status"], answer["headers"], content


@pytest.fixture
def token() -> tuple[str, str]:
    user = make_user(Role.VIEWER)
    workflow = make_workflow(owner=user, deployments=[make_deployment()])
    _, raw = api_token_create(user=user, name="plane")
    return raw, workflow.slug


def test_a_v1_call_skips_the_pages_middleware_but_keeps_the_security_headers(token: tuple[str, str]) -> None:
    raw, slug = token
    status, headers, content = _call("/v1/models", AUTHORIZATION=f"Bearer {raw}")
    assert status == 200 and [m["id"] for m in json.loads(content)["data"]] == [slug]
    assert headers["x-content-type-options"] == "nosniff" and "referrer-policy" in headers
    # No session, CSRF or clickjacking middleware ran: no cookie, no Vary on it, no frame header.
    assert "x-frame-options" not in headers and "set-cookie" not in headers
    assert "cookie" not in headers.get("vary", "").lower()

    # A page goes through the whole chain.
    status, headers, _ = _call("/login/")
    assert status == 200 and headers["x-frame-options"] == "DENY"


def test_the_data_plane_answers_its_errors_in_the_openai_shape(token: tuple[str, str]) -> None:
    raw, _ = token
    status, _, content = _call("/v1/nothing-here", AUTHORIZATION=f"Bearer {raw}")
    assert status == 404 and json.loads(content)["error"]["code"] == "unknown_url"
    # A Host outside ALLOWED_HOSTS is refused before the view, as the full chain refuses it.
    status, _, content = _call("/v1/models", host="evil.example", AUTHORIZATION=f"Bearer {raw}")
    assert status == 400 and json.loads(content)["error"]["type"] == "invalid_request_error"
    # The body limit from Content-Length, before anything reads the body.
    status, _, content = _call(
        "/v1/chat/completions", method="POST", content_length=str(10**12), AUTHORIZATION=f"Bearer {raw}"
    )
    assert status == 413 and json.loads(content)["error"]["code"] == "request_too_large"
    # No key: the gateway's own 401.
    status, _, content = _call("/v1/models")
    assert status == 401 and "error" in json.loads(content)
    # Under /v1 only the gateway's routes resolve: a page's path there is the OpenAI 404.
    status, _, content = _call("/v1/../login/")
    assert status == 404 and json.loads(content)["error"]["code"] == "unknown_url"
