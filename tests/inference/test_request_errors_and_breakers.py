"""Errors caused by the request never count against a deployment's circuit breaker.

The denial of service this guards against: a lone surrogate in a prompt crashed serve_model, the
router took the dropped connection for a dead server (retryable), and five such requests from a
viewer opened both replicas' circuits. Now the gateway refuses such input before routing,
serve_model answers it with a 400, and the router treats an upstream 400/413/422 as the
request's fault: no retry, no failover, no breaker count. Run with REDIS_URL, the breakers are
the shared Redis ones.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client

from bench.mockprovider import MockProviderServer
from billing.models import Unit
from inference.adapters.base import ChatMessage, ChatRequest, CompletionRequest, ProviderError
from inference.breaker.breakers import breaker_state
from inference.models import InferenceAttempt, InferenceRequest
from inference.router.entry import route
from registry.models import Deployment, FailoverEvent, Provider
from registry.services import api_token_create
from tests.factories import make_cluster, make_deployment, make_price, make_provider, make_workflow
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow

SURROGATE = "hi \ud800"
ROUNDS = 6  # more than INFERENCE_BREAKER_MIN_REQUESTS (5): enough to open a circuit if counted

# Bodies no provider can take, sent to the gateway (each refused there with a 400).
GATEWAY_BAD_BODIES: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": SURROGATE}]},
    {"messages": [{"role": "user", "content": 5}]},
    {"messages": [{"role": "user", "content": "x"}], "stream_options": "yes", "stream": True},
    {"messages": [{"role": "user", "content": "x"}], "n": True},
    {"messages": [{"role": "user", "content": "x"}], "temperature": 7},
]


def _gateway(user: User) -> Client:
    _, raw = api_token_create(user=user, name="breakers")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def _assert_no_circuit_opened(*deployments: Deployment) -> None:
    ledger_settled()
    assert [breaker_state(d.pk) for d in deployments] == ["closed"] * len(deployments)
    assert not FailoverEvent.objects.exists()


@pytest.mark.django_db
def test_bad_input_at_the_gateway_never_reaches_a_provider_nor_a_breaker(
    viewer: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    one, two = mock_provider(), mock_provider()
    replicas = [priced_deployment(one), priced_deployment(two)]
    workflow = routed_workflow(viewer, replicas)
    client = _gateway(viewer)
    for _ in range(ROUNDS):
        for fields in GATEWAY_BAD_BODIES:
            body = json.dumps({"model": workflow.slug, **fields})
            response = client.post("/v1/chat/completions", body, content_type="application/json")
            assert response.status_code == 400, response.content
    assert one.behaviour.total_calls() == two.behaviour.total_calls() == 0
    _assert_no_circuit_opened(*replicas)
    assert not InferenceRequest.objects.exists()
    ok = client.post(
        "/v1/chat/completions",
        json.dumps({"model": workflow.slug, "messages": [{"role": "user", "content": "ping"}]}),
        content_type="application/json",
    )
    assert ok.status_code == 200 and ok["x-switchyard-deployment"] == replicas[0].slug


@pytest.mark.django_db
@pytest.mark.parametrize("status", [400, 413, 422])
def test_an_upstream_client_error_is_not_retried_failed_over_nor_counted(
    admin_user: User, mock_provider: Callable[..., MockProviderServer], status: int
) -> None:
    rejecting, healthy = mock_provider(status=status), mock_provider()
    replicas = [priced_deployment(rejecting), priced_deployment(healthy)]
    workflow = routed_workflow(admin_user, replicas)
    for _ in range(ROUNDS):
        result = route(workflow=workflow, request=CompletionRequest(prompt="x"))
        assert not result.ok and result.status_code == status
    assert rejecting.behaviour.total_calls() == ROUNDS and healthy.behaviour.total_calls() == 0
    _assert_no_circuit_opened(*replicas)
    outcomes = set(InferenceAttempt.objects.values_list("outcome", "status_code"))
    assert outcomes == {(InferenceAttempt.Outcome.NON_RETRYABLE, status)}


@pytest.mark.django_db
def test_the_same_number_of_server_errors_does_open_the_circuit(
    admin_user: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    """The control for the tests above: the breaker in this configuration does open."""
    failing, healthy = mock_provider(status=503), mock_provider()
    replicas = [priced_deployment(failing), priced_deployment(healthy)]
    workflow = routed_workflow(admin_user, replicas)
    for _ in range(ROUNDS):
        assert route(workflow=workflow, request=CompletionRequest(prompt="x")).ok
    assert breaker_state(replicas[0].pk) == "open" and FailoverEvent.objects.exists()


@pytest.mark.django_db
def test_a_half_open_probe_answered_with_a_client_error_closes_the_circuit(
    admin_user: User, mock_provider: Callable[..., MockProviderServer], settings: Any
) -> None:
    """The deployment answered properly (the request was at fault): it is healthy again, rather
    than left half-open with its probe spent for another cooldown."""
    settings.INFERENCE_BREAKER_COOLDOWN_SECONDS = 0.2
    server = mock_provider(status=503)
    (deployment,) = replicas = [priced_deployment(server)]
    workflow = routed_workflow(admin_user, replicas)
    for _ in range(3):
        route(workflow=workflow, request=CompletionRequest(prompt="x"))
    assert breaker_state(deployment.pk) == "open"
    time.sleep(0.3)
    server.behaviour.status = 400
    assert route(workflow=workflow, request=CompletionRequest(prompt="x")).status_code == 400
    assert breaker_state(deployment.pk) == "closed"


def test_a_provider_error_with_a_client_status_is_never_retryable() -> None:
    assert ProviderError("x", retryable=True, status_code=422).retryable is False
    assert ProviderError("x", retryable=True, status_code=422).client_error is True
    assert ProviderError("x", retryable=True, status_code=503).client_error is False
    assert ProviderError("x", retryable=True).retryable is True


def test_a_bedrock_validation_error_inside_a_stream_is_a_client_error() -> None:
    from botocore.exceptions import EventStreamError

    from inference.adapters.bedrock import _map_error

    error = EventStreamError({"Error": {"Code": "ValidationException", "Message": "bad"}}, "ConverseStream")
    mapped = _map_error(error, "bedrock-1")
    assert (mapped.status_code, mapped.client_error, mapped.retryable) == (400, True, False)


# --- A real serve_model process ------------------------------------------------------------------


def _served_replicas(model: Any, base_url: str, owner: User) -> tuple[Any, list[Deployment]]:
    """Two self-hosted deployments (replicas) of one model, both on the serve_model process."""
    cluster = make_cluster(provider=make_provider(kind=Provider.Kind.ON_PREM), price=Decimal("1.2"))
    replicas = []
    for _ in range(2):
        replica = make_deployment(
            model=model,
            provider=cluster.provider,
            hosting_cluster=cluster,
            base_url=base_url,
            provider_model_id=model.slug,
        )
        for unit in (Unit.INPUT_TOKENS_1M, Unit.OUTPUT_TOKENS_1M):
            make_price(deployment=replica, unit=unit, unit_price=Decimal("0"))
        replicas.append(replica)
    return make_workflow(owner=owner, deployments=replicas), replicas


def _post_raw(conn: http.client.HTTPConnection, path: str, body: bytes, **headers: str) -> tuple[int, Any]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **headers})
    answer = conn.getresponse()
    return answer.status, json.loads(answer.read())


@pytest.mark.integration
def test_serve_model_answers_bad_input_with_400_and_no_circuit_opens(
    served: tuple[Any, str, str], viewer: User
) -> None:
    model, _, base_url = served
    workflow, replicas = _served_replicas(model, base_url, viewer)
    bad_requests = [
        CompletionRequest(prompt=SURROGATE),
        ChatRequest(messages=(ChatMessage("user", SURROGATE),)),
        ChatRequest(messages=(ChatMessage("user", "x"),), stop=(SURROGATE,)),
        ChatRequest(messages=(ChatMessage("narrator", "x"),)),  # a role the model server refuses
        CompletionRequest(prompt="x", max_tokens=5000),  # over serve_model's own limit
    ]
    # Routed directly (as batch lines and eval runs are), so the model server sees the input.
    for _ in range(ROUNDS):
        for request in bad_requests:
            result = route(workflow=workflow, request=request)
            assert not result.ok and result.status_code == 400, result.error
    _assert_no_circuit_opened(*replicas)
    attempts = InferenceAttempt.objects.all()
    assert attempts.count() == ROUNDS * len(bad_requests)  # one call each: no retry, no failover
    assert set(attempts.values_list("outcome", "status_code")) == {
        (InferenceAttempt.Outcome.NON_RETRYABLE, 400)
    }
    assert set(attempts.values_list("deployment_id", flat=True)) == {replicas[0].pk}

    # The same through the gateway: refused there, the model server is not even called.
    client = _gateway(viewer)
    before = InferenceRequest.objects.count()
    for _ in range(ROUNDS):
        for fields in GATEWAY_BAD_BODIES:
            body = json.dumps({"model": workflow.slug, **fields})
            assert (
                client.post("/v1/chat/completions", body, content_type="application/json").status_code == 400
            )
    assert InferenceRequest.objects.count() == before
    _assert_no_circuit_opened(*replicas)

    # The server itself answers every bad body on a kept-alive connection with an OpenAI-style
    # 400 (it used to drop the connection), and still serves a good request afterwards.
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
    try:
        for path, body in [
            ("/v1/completions", json.dumps({"prompt": SURROGATE}).encode()),
            (
                "/v1/chat/completions",
                json.dumps({"messages": [{"role": "user", "content": SURROGATE}]}).encode(),
            ),
            ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": 5}]}).encode()),
            ("/v1/chat/completions", json.dumps({"messages": ["x"]}).encode()),
            ("/v1/completions", b"{not json"),
            ("/v1/completions", b'{"prompt": "caf\xe9"}'),
            ("/v1/completions", b"[1]"),
            ("/v1/completions", json.dumps({"prompt": "x", "temperature": "hot"}).encode()),
            ("/v1/completions", json.dumps({"prompt": "x", "stop": [1]}).encode()),
            ("/v1/completions", json.dumps({"prompt": "x", "seed": "s"}).encode()),
            ("/v1/completions", json.dumps({"prompt": "x", "max_tokens": True}).encode()),
            ("/v1/completions", b"[" * 50_000 + b"]" * 50_000),
        ]:
            status, doc = _post_raw(conn, path, body)
            assert status == 400, (body[:80], doc)
            assert doc["error"]["type"] == "invalid_request_error" and doc["error"]["message"]
        status, doc = _post_raw(
            conn, "/v1/completions", json.dumps({"prompt": "hello", "max_tokens": 3}).encode()
        )
        assert status == 200 and doc["usage"]["completion_tokens"] == 3
    finally:
        conn.close()
    ok = route(workflow=workflow, request=CompletionRequest(prompt="hello", max_tokens=4))
    assert ok.ok and ok.deployment_slug == replicas[0].slug
