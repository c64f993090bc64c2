"""Upstream 429s with Retry-After cool a deployment down and fail over; the policy's
max_cost_per_request refuses a call whose estimate is above it before it is made."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client

from inference.models import InferenceAttempt, InferenceRequest
from registry.services import api_token_create
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.inference.recording_provider import RecordingProvider

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def providers() -> Iterator[Callable[[], RecordingProvider]]:
    started: list[RecordingProvider] = []

    def start() -> RecordingProvider:
        server = RecordingProvider()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _post(user: User, workflow: str, **fields: object) -> object:
    _, raw = api_token_create(user=user, name="limits")
    body = json.dumps({"model": workflow, "messages": [{"role": "user", "content": "hi"}], **fields})
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
        "/v1/chat/completions", body, content_type="application/json"
    )


def test_a_429_with_retry_after_cools_the_deployment_down_and_the_route_fails_over(
    viewer: User, providers: Callable[[], RecordingProvider]
) -> None:
    limited, spare = providers(), providers()
    limited.script.status, limited.script.headers = 429, {"Retry-After": "30"}
    route = [priced_deployment(base_url=limited.base_url), priced_deployment(base_url=spare.base_url)]
    workflow = routed_workflow(viewer, route)

    first = _post(viewer, workflow.slug)
    assert first.status_code == 200 and first["x-switchyard-deployment"] == route[1].slug
    # For the next 30 s the limited deployment is not called at all, although its circuit is
    # closed (one failure is far below the breaker's threshold).
    second = _post(viewer, workflow.slug)
    assert second.status_code == 200 and limited.script.calls() == 1 and spare.script.calls() == 2
    ledger_settled()
    outcomes = list(
        InferenceAttempt.objects.filter(deployment=route[0])
        .order_by("request_id")
        .values_list("outcome", "status_code")
    )
    assert outcomes == [("retryable", 429), ("circuit_open", None)]


def test_when_every_deployment_is_rate_limited_the_caller_gets_429_with_the_shortest_wait(
    viewer: User, providers: Callable[[], RecordingProvider]
) -> None:
    one, two = providers(), providers()
    one.script.status, one.script.headers = 429, {"Retry-After": "12"}
    two.script.status, two.script.headers = 429, {"retry-after-ms": "6500"}
    workflow = routed_workflow(
        viewer, [priced_deployment(base_url=one.base_url), priced_deployment(base_url=two.base_url)]
    )
    response = _post(viewer, workflow.slug)
    assert response.status_code == 429
    assert response["Retry-After"] == "7"  # 6.5 s, rounded up
    assert response.json()["error"]["code"] == "rate_limited"
    # Each was called once: the second round of retries skips both while they cool down.
    assert (one.script.calls(), two.script.calls()) == (1, 1)


def test_max_cost_per_request_refuses_a_request_estimated_above_it_before_any_call(
    viewer: User, providers: Callable[[], RecordingProvider]
) -> None:
    provider = providers()
    # $1 in and $3 out per 1M tokens: max_tokens 1000 is estimated at $0.003 and a bit.
    workflow = routed_workflow(
        viewer, [priced_deployment(base_url=provider.base_url)], max_cost_per_request=Decimal("0.001")
    )
    response = _post(viewer, workflow.slug, max_tokens=1000)
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("max_cost_exceeded", "max_tokens")
    assert "max_cost_per_request 0.001" in error["message"]
    assert provider.script.calls() == 0
    ledger_settled()
    refused = InferenceRequest.objects.get()
    assert refused.status == "failed" and refused.cost == 0
    assert list(refused.attempt_rows.values_list("outcome", flat=True)) == ["over_cost"]

    assert _post(viewer, workflow.slug, max_tokens=100).status_code == 200
    assert provider.script.calls() == 1
