"""What a /v1 Idempotency-Key keeps: without retention opt-in a hash of the body and the status,
never the answer (a retry is a 409 that calls nothing); with opt-in the answer too, but only for
the replay window, blanked by beat's purge after it and by an opt-out at once."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from bench.mockprovider import MockProviderServer
from inference import tasks
from inference.models import InferenceRequest
from registry.models import Workflow
from registry.services import api_token_create
from tests.factories import api_client
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.inference.recording_provider import RecordingProvider, chat_answer

pytestmark = pytest.mark.django_db
Start = Callable[..., MockProviderServer]


def _client(user: User) -> Client:
    _, raw = api_token_create(user=user, name="idempotent")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def _ask(client: Client, workflow: Workflow, key: str, content: str = "ping") -> Any:
    body = {"model": workflow.slug, "messages": [{"role": "user", "content": content}]}
    return client.post(
        "/v1/chat/completions", json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )


def _text(response: Any) -> str:
    assert response.status_code == 200, response.content
    return str(response.json()["choices"][0]["message"]["content"])


def _kept_workflow(owner: User, server: MockProviderServer) -> Workflow:
    return routed_workflow(owner, [priced_deployment(server)], retain_prompts=True, prompt_retention_days=7)


def test_without_opt_in_a_keyed_request_keeps_a_hash_and_its_status_and_a_retry_is_a_409(
    operator: User, mock_provider: Start
) -> None:
    server = mock_provider(text="private answer")
    workflow = routed_workflow(operator, [priced_deployment(server)])
    gateway = _client(operator)
    assert _text(_ask(gateway, workflow, "k-1")) == "private answer"

    row = InferenceRequest.objects.get()
    assert row.response_text == "" and row.answer_kept_until is None
    assert row.status == InferenceRequest.Status.SUCCEEDED
    body = {"messages": [{"content": "ping", "role": "user"}], "model": workflow.slug}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    assert row.request_digest == hashlib.sha256(canonical.encode()).hexdigest()

    retry = _ask(gateway, workflow, "k-1")
    assert retry.status_code == 409
    error = retry.json()["error"]
    assert error["code"] == "idempotent_answer_not_kept" and error["param"] == "Idempotency-Key"
    assert f"request {row.pk}" in error["message"] and "private answer" not in retry.content.decode()
    assert server.behaviour.total_calls() == 1  # nothing called (or billed) twice
    assert InferenceRequest.objects.count() == 1


def test_a_retry_naming_a_used_key_with_another_body_is_refused_and_calls_nothing(
    operator: User, mock_provider: Start
) -> None:
    server = mock_provider(text="the answer to ping")
    workflow = _kept_workflow(operator, server)
    gateway = _client(operator)
    assert _text(_ask(gateway, workflow, "k-2")) == "the answer to ping"

    other = _ask(gateway, workflow, "k-2", content="something else")
    assert other.status_code == 422, other.content
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    assert "the answer to ping" not in other.content.decode()
    assert server.behaviour.total_calls() == 1
    assert InferenceRequest.objects.count() == 1


def test_with_opt_in_the_answer_is_replayed_in_the_window_only_and_purged_after(
    operator: User, mock_provider: Start, settings: Any
) -> None:
    settings.IDEMPOTENCY_REPLAY_SECONDS = 300
    server = mock_provider(text="kept answer")
    workflow = _kept_workflow(operator, server)
    gateway = _client(operator)
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        assert _text(_ask(gateway, workflow, "k-3")) == "kept answer"
    row = InferenceRequest.objects.get()
    assert row.response_text == "kept answer"
    assert row.answer_kept_until == start + timedelta(seconds=300)

    server.behaviour.text = "a second call"
    with time_machine.travel(start + timedelta(seconds=299), tick=False):
        assert _text(_ask(gateway, workflow, "k-3")) == "kept answer"  # replayed, not called
        assert tasks.idempotent_answers_purge.apply().get() == 0
    with time_machine.travel(start + timedelta(seconds=301), tick=False):
        # Past the window the answer is not handed out, even before beat's purge ran ...
        late = _ask(gateway, workflow, "k-3")
        assert late.status_code == 409 and late.json()["error"]["code"] == "idempotent_answer_not_kept"
        # ... and the purge blanks it.
        assert tasks.idempotent_answers_purge.apply().get() == 1
    row.refresh_from_db()
    assert row.response_text == "" and row.response_doc is None and row.answer_kept_until is None
    assert server.behaviour.total_calls() == 1


def test_opting_out_blanks_the_answers_kept_for_replays_at_once(operator: User, mock_provider: Start) -> None:
    server = mock_provider(text="kept until opt-out")
    workflow = _kept_workflow(operator, server)
    gateway = _client(operator)
    assert _text(_ask(gateway, workflow, "k-4")) == "kept until opt-out"
    assert InferenceRequest.objects.get().response_text == "kept until opt-out"

    response = api_client(operator).patch(
        f"/api/workflows/{workflow.slug}/", {"retain_prompts": False}, format="json"
    )
    assert response.status_code == 200, response.content
    row = InferenceRequest.objects.get()
    assert row.response_text == "" and row.answer_kept_until is None
    assert _ask(gateway, workflow, "k-4").status_code == 409
    assert server.behaviour.total_calls() == 1


def test_a_retry_of_a_failed_request_gets_the_failure_again_without_a_call(
    operator: User, mock_provider: Start
) -> None:
    server = mock_provider(status=503)
    workflow = routed_workflow(operator, [priced_deployment(server)])
    gateway = _client(operator)
    first = _ask(gateway, workflow, "k-5")
    assert first.status_code == 502, first.content
    calls = server.behaviour.total_calls()
    again = _ask(gateway, workflow, "k-5")
    assert again.status_code == 502 and again.json()["error"]["code"] == "upstream_error"
    assert server.behaviour.total_calls() == calls
    assert InferenceRequest.objects.count() == 1


def _anthropic_deployment(server: Any) -> Any:
    from registry.models import Provider
    from registry.services import provider_set_credentials
    from tests.factories import make_provider

    provider = make_provider(kind=Provider.Kind.ANTHROPIC, base_url=server.url)
    provider_set_credentials(provider=provider, credentials="sk-ant-loopback")
    return priced_deployment(provider=provider, provider_model_id="claude-test")


@pytest.mark.parametrize(
    "failure", ["provider_400", "provider_429", "adapter_refusal", "budget", "cost_limit"]
)
def test_a_replayed_failure_answers_as_the_request_did_the_first_time(
    operator: User, mock_provider: Start, failure: str
) -> None:
    """Not a 502 for every failure: the status, the code and (for our own refusals) the words."""
    from decimal import Decimal

    from billing.models import Budget
    from tests.inference.anthropic_server import MessagesServer

    body: dict[str, Any] = {"messages": [{"role": "user", "content": "ping"}]}
    claude = None
    if failure == "adapter_refusal":
        claude = MessagesServer()
        workflow = routed_workflow(operator, [_anthropic_deployment(claude)])
        body["seed"] = 7  # Messages has no seed: refused by name before any call
    elif failure == "cost_limit":
        workflow = routed_workflow(
            operator, [priced_deployment(mock_provider())], max_cost_per_request=Decimal("0.000000001")
        )
    else:
        status = {"provider_400": 400, "provider_429": 429}.get(failure, 200)
        workflow = routed_workflow(operator, [priced_deployment(mock_provider(status=status))])
    if failure == "budget":
        Budget.objects.create(
            name="spent", scope=Budget.Scope.WORKFLOW, workflow=workflow, limit_amount=0, hard_limit=True
        )
    gateway = _client(operator)

    def ask() -> Any:
        return gateway.post(
            "/v1/chat/completions",
            json.dumps({"model": workflow.slug, **body}),
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=f"k-{failure}",
        )

    try:
        first = ask()
        assert first.status_code != 200, first.content
        again = ask()
    finally:
        if claude is not None:
            claude.stop()
    expected = {
        "provider_400": (400, "provider_rejected"),
        "provider_429": (429, "rate_limited"),
        "adapter_refusal": (400, "provider_rejected"),
        "budget": (402, "budget_exhausted"),
        "cost_limit": (400, "max_cost_exceeded"),
    }[failure]
    assert (first.status_code, first.json()["error"]["code"]) == expected
    assert (again.status_code, again.json()["error"]["code"]) == expected
    if failure in ("adapter_refusal", "budget", "cost_limit"):  # our own words, shown both times
        assert again.json()["error"]["message"] == first.json()["error"]["message"]
    assert InferenceRequest.objects.filter(workflow=workflow).count() == 1
    if claude is not None:
        assert claude.behaviour.requests == []


CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
# (path, body): a tool-call answer asked for through each API that takes Idempotency-Key.
KEYED_APIS = {
    "chat": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "weather?"}], "tools": [TOOL]},
    ),
    "messages": (
        "/v1/messages",
        {
            "max_tokens": 32,
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        },
    ),
    "responses": (
        "/v1/responses",
        {
            "input": "weather?",
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
        },
    ),
}


@pytest.mark.parametrize("api", list(KEYED_APIS))
def test_a_replayed_answer_is_the_whole_answer_with_its_tool_calls(operator: User, api: str) -> None:
    """An agent retrying a request must get the tool call it was answered, not an empty turn."""
    provider = RecordingProvider()
    try:
        provider.script.answer = chat_answer(None, tool_calls=[CALL], finish_reason="tool_calls")
        workflow = routed_workflow(
            operator,
            [priced_deployment(base_url=provider.base_url)],
            retain_prompts=True,
            prompt_retention_days=7,
        )
        _, raw = api_token_create(user=operator, name="replay")
        client = Client(HTTP_X_API_KEY=raw)
        path, body = KEYED_APIS[api]
        first, again = (
            client.post(
                path,
                json.dumps({"model": workflow.slug, **body}),
                content_type="application/json",
                HTTP_IDEMPOTENCY_KEY="agent-turn-1",
            )
            for _ in range(2)
        )
        assert first.status_code == again.status_code == 200, (first.content, again.content)
        assert again.json() == first.json()
        assert provider.script.calls() == 1  # the retry was answered from the record
        assert "get_weather" in json.dumps(again.json())
    finally:
        provider.stop()


def test_a_failure_still_in_the_journal_is_replayed_from_its_entry(operator: User) -> None:
    """Before the folder writes the attempt rows, the journal entry on the request row says how
    it failed (inference.recording: FoldJob.journal)."""
    from inference.adapters.base import Target, adapter_refusal
    from inference.router.finish import replay

    deployment = priced_deployment(base_url="http://127.0.0.1:9/v1")
    workflow = routed_workflow(operator, [deployment])
    target = Target(
        deployment_id=deployment.pk,
        slug=deployment.slug,
        kind="anthropic",
        base_url="http://127.0.0.1:9",
        provider_model_id="claude-test",
        credentials="k",
        allow_private=True,
    )
    refused = adapter_refusal(target, "Anthropic Messages", "no seed")
    entry = {
        "v": 1,
        "attempts": [
            [0, deployment.pk, "retryable", 503, 1.0, 0, 0, "HTTP 503", 0.0, ""],
            [1, deployment.pk, "unsupported", 400, 0.1, 0, 0, str(refused), 0.0, ""],
        ],
        "billed": [],
    }
    row = InferenceRequest.objects.create(
        workflow=workflow, status="failed", ledger_pending=entry, client_request_id="batch:1:journal"
    )
    result = replay(row)
    assert (result.ok, result.status_code, result.refusal) == (False, 400, refused.refusal)
    assert result.refusal == "Anthropic Messages: no seed"
