"""The /v1 body limit under the WSGI servers the project runs (wsgiref, and runserver as `make
demo` does; gunicorn in tests/inference/test_metrics_workers.py): a body over
SWITCHYARD_V1_MAX_BODY_BYTES is an OpenAI-style 413 JSON (never a plain 500 for a hop-by-hop
header), and a 5 MB body (a long context, an image) is answered by default."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest
from django.contrib.auth.models import User
from django.core.servers import basehttp
from django.core.wsgi import get_wsgi_application

from bench.mockprovider import MockProviderServer
from inference.models import InferenceRequest
from registry.models import Workflow
from registry.services import api_token_create
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db(transaction=True)  # the server's thread reads committed rows


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass


class _QuietRunserverHandler(basehttp.WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


def _wsgiref() -> WSGIServer:
    return make_server("127.0.0.1", 0, get_wsgi_application(), handler_class=_QuietHandler)


def _runserver() -> WSGIServer:
    server = basehttp.ThreadedWSGIServer(("127.0.0.1", 0), _QuietRunserverHandler)
    server.set_app(get_wsgi_application())
    return server


@pytest.fixture(params=[_wsgiref, _runserver], ids=["wsgiref", "runserver"])
def port(request: pytest.FixtureRequest) -> Iterator[int]:
    server: WSGIServer = request.param()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def gateway(
    viewer: User, mock_provider: Callable[..., MockProviderServer]
) -> tuple[Workflow, str, MockProviderServer]:
    server = mock_provider(text="read it all")
    workflow = routed_workflow(viewer, [priced_deployment(server)])
    _, raw = api_token_create(user=viewer, name="big bodies")
    return workflow, raw, server


def _chat(workflow: Workflow, size: int) -> bytes:
    return json.dumps(
        {"model": workflow.slug, "messages": [{"role": "user", "content": "x" * size}]}
    ).encode()


def test_a_body_over_the_limit_is_an_openai_413_under_the_server(
    port: int, gateway: tuple[Workflow, str, MockProviderServer], settings: Any
) -> None:
    settings.V1_MAX_BODY_BYTES = 100_000
    workflow, raw, server = gateway
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    # Announced, not sent: the 413 comes from the Content-Length before anything reads the body.
    connection.putrequest("POST", "/v1/chat/completions")
    connection.putheader("Authorization", f"Bearer {raw}")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(settings.V1_MAX_BODY_BYTES + 1))
    connection.endheaders()
    response = connection.getresponse()
    body = response.read()
    connection.close()
    assert response.status == 413, body[:300]
    assert response.getheader("Content-Type") == "application/json"
    error = json.loads(body)["error"]
    assert error["code"] == "request_too_large" and error["type"] == "invalid_request_error"
    assert "100000" in error["message"]
    assert server.behaviour.total_calls() == 0 and not InferenceRequest.objects.exists()


def test_a_5_mb_body_is_answered_by_default_under_the_server(
    port: int, gateway: tuple[Workflow, str, MockProviderServer], settings: Any
) -> None:
    assert settings.V1_MAX_BODY_BYTES == 32 * 1024 * 1024
    workflow, raw, server = gateway
    body = _chat(workflow, 5 * 1024 * 1024)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request(
        "POST",
        "/v1/chat/completions",
        body=body,
        headers={"Authorization": f"Bearer {raw}", "Content-Type": "application/json"},
    )
    response = connection.getresponse()
    answer = response.read()
    connection.close()
    assert response.status == 200, answer[:300]
    assert json.loads(answer)["choices"][0]["message"]["content"] == "read it all"
    assert server.behaviour.total_calls() == 1
