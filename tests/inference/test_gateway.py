"""The /v1 gateway through Django's test client: formats, headers, auth, scopes, errors, switching."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from bench.mockprovider import MockProviderServer
from billing.models import Budget
from inference.models import InferenceRequest
from registry.auth.roles import Role
from registry.models import RoutingPolicyVersion
from registry.services import api_token_create, api_token_revoke
from tests.factories import api_client, make_user
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db


def _client(user: User, *, workflows: list[Any] | None = None) -> Client:
    token, raw = api_token_create(user=user, name="gateway")
    if workflows:
        token.workflows.set(workflows)
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def _chat(client: Client, model: str, **extra: Any) -> Any:
    body = {"model": model, "messages": [{"role": "user", "content": "ping"}], **extra}
    return client.post("/v1/chat/completions", json.dumps(body), content_type="application/json")


def test_chat_completion_answers_with_deployment_and_cost_headers(
    operator: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    server = mock_provider(text="pong", tokens_in=1000, tokens_out=1000)
    primary = priced_deployment(server)
    workflow = routed_workflow(operator, [primary])
    response = _chat(_client(operator), workflow.slug)
    assert response.status_code == 200
    doc = response.json()
    assert doc["object"] == "chat.completion" and doc["model"] == workflow.slug
    assert doc["choices"][0]["message"] == {"role": "assistant", "content": "pong"}
    assert doc["usage"] == {"prompt_tokens": 1000, "completion_tokens": 1000, "total_tokens": 2000}
    assert response["x-switchyard-deployment"] == primary.slug
    assert response["x-switchyard-cost"] == "0.004000000"
    row = InferenceRequest.objects.get(pk=int(response["x-switchyard-request-id"]))
    assert row.cost == Decimal("0.004") and row.endpoint == "chat"


def test_completion_and_stream(viewer: User, mock_provider: Callable[..., MockProviderServer]) -> None:
    server = mock_provider(text="a b c")
    workflow = routed_workflow(viewer, [priced_deployment(server)])
    client = _client(viewer)
    done = client.post(
        "/v1/completions",
        json.dumps({"model": workflow.slug, "prompt": "x"}),
        content_type="application/json",
    )
    assert done.status_code == 200 and done.json()["choices"][0]["text"] == "a b c"
    streamed = _chat(client, workflow.slug, stream=True, stream_options={"include_usage": True})
    assert streamed.status_code == 200 and streamed["Content-Type"] == "text/event-stream"
    raw = b"".join(streamed.streaming_content).decode()
    events = [line[6:] for line in raw.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    docs = [json.loads(e) for e in events[:-1]]
    text = "".join(d["choices"][0]["delta"].get("content", "") for d in docs if d["choices"])
    assert text == "a b c"
    assert docs[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    row = InferenceRequest.objects.filter(stream=True).get()
    assert row.status == "succeeded" and row.ttft_ms is not None and row.tokens_out == 3


def test_auth_and_scopes(viewer: User, mock_provider: Callable[..., MockProviderServer]) -> None:
    server = mock_provider()
    allowed = routed_workflow(viewer, [priced_deployment(server)])
    other = routed_workflow(viewer, [priced_deployment(server)])
    assert _chat(Client(), allowed.slug).status_code == 401
    assert (
        _chat(Client(HTTP_AUTHORIZATION="Bearer sy_nope_nope"), allowed.slug).json()["error"]["code"]
        == "invalid_api_key"
    )
    scoped = _client(viewer, workflows=[allowed])
    assert _chat(scoped, allowed.slug).status_code == 200
    refused = _chat(scoped, other.slug)
    assert refused.status_code == 403
    assert refused.json()["error"] == {
        "message": f"This API key may not call workflow {other.slug!r}",
        "type": "permission_error",
        "param": None,
        "code": "workflow_not_allowed",
    }
    listed = scoped.get("/v1/models").json()
    assert [m["id"] for m in listed["data"]] == [allowed.slug]
    unscoped = {m["id"] for m in _client(viewer).get("/v1/models").json()["data"]}
    assert {allowed.slug, other.slug} <= unscoped
    # A user without any role may use nothing.
    nobody = _client(make_user())
    assert _chat(nobody, allowed.slug).status_code == 403
    assert nobody.get("/v1/models").json()["data"] == []


def test_revoked_token_is_refused(viewer: User, mock_provider: Callable[..., MockProviderServer]) -> None:
    workflow = routed_workflow(viewer, [priced_deployment(mock_provider())])
    token, raw = api_token_create(user=viewer, name="short-lived")
    api_token_revoke(token=token)
    assert _chat(Client(HTTP_AUTHORIZATION=f"Bearer {raw}"), workflow.slug).status_code == 401


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "invalid_model"),
        ({"model": "WF", "messages": []}, "invalid_messages"),
        (
            {"model": "WF", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
            "invalid_max_tokens",
        ),
        (
            {"model": "WF", "messages": [{"role": "user", "content": "x"}], "temperature": 9},
            "invalid_temperature",
        ),
        ({"model": "WF", "messages": [{"role": "user", "content": "x"}], "n": 0}, "invalid_n"),
    ],
)
def test_bad_input_is_400(
    viewer: User, mock_provider: Callable[..., MockProviderServer], body: dict[str, Any], code: str
) -> None:
    workflow = routed_workflow(viewer, [priced_deployment(mock_provider())])
    if body.get("model") == "WF":
        body["model"] = workflow.slug
    response = _client(viewer).post("/v1/chat/completions", json.dumps(body), content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]["code"] == code
    assert InferenceRequest.objects.count() == 0


def test_unknown_workflow_404_budget_402_upstream_502(
    viewer: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    client = _client(viewer)
    assert _chat(client, "no-such-workflow").json()["error"]["code"] == "model_not_found"
    broken = routed_workflow(viewer, [priced_deployment(mock_provider(status=500))])
    failed = _chat(client, broken.slug)
    assert failed.status_code == 502 and failed.json()["error"]["type"] == "api_error"
    assert InferenceRequest.objects.get(workflow=broken).status == "failed"
    capped = routed_workflow(viewer, [priced_deployment(mock_provider())])
    Budget.objects.create(
        name="zero", scope=Budget.Scope.WORKFLOW, workflow=capped, limit_amount=0, hard_limit=True
    )
    refused = _chat(client, capped.slug)
    assert refused.status_code == 402
    assert (
        refused.json()["error"]["code"] == "budget_exhausted" and "zero" in refused.json()["error"]["message"]
    )


def test_switch_takes_effect_on_the_next_request_and_is_audited(
    operator: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    first, second = priced_deployment(mock_provider()), priced_deployment(mock_provider())
    workflow = routed_workflow(operator, [first, second])
    client = _client(operator)
    assert _chat(client, workflow.slug)["x-switchyard-deployment"] == first.slug
    switched = api_client(operator).post(
        f"/api/workflows/{workflow.slug}/switch/",
        {"deployment": second.slug, "reason": "cheaper this week"},
        format="json",
    )
    assert switched.status_code == 201
    after = _chat(client, workflow.slug)
    assert after["x-switchyard-deployment"] == second.slug
    assert after["x-switchyard-policy-version"] == "2"
    policy = RoutingPolicyVersion.objects.get(workflow=workflow, version=2)
    assert (policy.author_id, policy.reason) == (operator.pk, "cheaper this week")
    assert InferenceRequest.objects.order_by("-id").first().policy_version_id == policy.pk  # type: ignore[union-attr]
    assert operator.groups.filter(name=Role.OPERATOR.value).exists()


def test_chaos_api_switches_a_drill_for_the_next_request(
    operator: User, viewer: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    primary, fallback = priced_deployment(mock_provider()), priced_deployment(mock_provider())
    workflow = routed_workflow(operator, [primary, fallback])
    gateway = _client(viewer)
    assert _chat(gateway, workflow.slug)["x-switchyard-deployment"] == primary.slug
    api = api_client(operator)
    put = api.put(
        f"/api/chaos/{primary.slug}/",
        {"enabled": True, "error_rate": 1, "status_codes": [503]},
        format="json",
    )
    assert put.status_code == 200 and put.json()["enabled"] is True
    assert _chat(gateway, workflow.slug)["x-switchyard-deployment"] == fallback.slug
    listed = {d["deployment"]: d["enabled"] for d in api_client(viewer).get("/api/chaos/").json()}
    assert listed[primary.slug] is True and listed[fallback.slug] is False
    assert (
        api_client(viewer).patch(f"/api/chaos/{primary.slug}/", {"enabled": False}, format="json").status_code
        == 403
    )
    bad = api.patch(f"/api/chaos/{primary.slug}/", {"error_rate": 2}, format="json")
    assert bad.status_code == 400 and "error_rate" in bad.json()
    off = api.patch(f"/api/chaos/{primary.slug}/", {"enabled": False}, format="json")
    assert off.status_code == 200 and off.json()["error_rate"] == 1.0  # PATCH kept the rest
    assert _chat(gateway, workflow.slug)["x-switchyard-deployment"] == primary.slug


@pytest.mark.parametrize(
    ("upstream", "status", "type_", "code"),
    [
        (500, 502, "api_error", "upstream_error"),
        (429, 429, "rate_limit_error", "rate_limited"),
        (400, 400, "invalid_request_error", "provider_rejected"),
        (422, 400, "invalid_request_error", "provider_rejected"),
    ],
)
def test_upstream_error_bodies_are_logged_not_returned(
    viewer: User,
    mock_provider: Callable[..., MockProviderServer],
    caplog: pytest.LogCaptureFixture,
    upstream: int,
    status: int,
    type_: str,
    code: str,
) -> None:
    deployment = priced_deployment(mock_provider(status=upstream))
    workflow = routed_workflow(viewer, [deployment])
    with caplog.at_level("WARNING", logger="inference.gateway"):
        response = _chat(_client(viewer), workflow.slug)
    assert response.status_code == status
    error = response.json()["error"]
    request_id = response["x-switchyard-request-id"]
    assert (error["type"], error["code"]) == (type_, code) and f"(request {request_id})" in error["message"]
    assert (
        "mock failure" not in response.content.decode() and deployment.slug not in response.content.decode()
    )
    assert "mock failure" in caplog.text and request_id in caplog.text
