"""A deployment that serves OpenAI's Responses API itself (Deployment.speaks_responses) gets a
/v1/responses request as the caller wrote it, at its `/responses`, not translated to chat.

The provider is a loopback Responses server (tests/inference/responses_server.py) that records
the path and body it gets: each test checks the exact body sent upstream (`store` false: the
conversation is Switchyard's to keep), what the `openai` SDK made of the answer (plain and
streamed, through the SDK's own accumulator), and the ledger.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import openai
import pytest
from django.contrib.auth.models import User

from billing.models import Unit, UsageRecord
from inference.adapters.base import ChatMessage, ChatRequest, ProviderError, Target
from inference.adapters.openai_compat import OpenAICompatibleAdapter
from inference.models import InferenceRequest
from registry.models import Workflow
from registry.services import api_token_create
from tests.factories import make_price
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.inference.responses_server import ResponsesServer, call_item, text_item

pytestmark = pytest.mark.django_db(transaction=True)

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture
def upstream() -> Iterator[ResponsesServer]:
    server = ResponsesServer()
    yield server
    server.stop()


@pytest.fixture
def setup(live_server: Any, operator: User, upstream: ResponsesServer) -> tuple[openai.OpenAI, Workflow]:
    deployment = priced_deployment(
        base_url=upstream.url, provider_model_id="gpt-upstream", speaks_responses=True
    )
    make_price(unit=Unit.CACHED_INPUT_TOKENS_1M, unit_price=Decimal("0.25"), deployment=deployment)
    make_price(unit=Unit.REASONING_TOKENS_1M, unit_price=Decimal("5"), deployment=deployment)
    workflow = routed_workflow(operator, [deployment])
    _, raw = api_token_create(user=operator, name="responses-native")
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0), workflow


def _create(client: openai.OpenAI, *, stream: bool, **kwargs: Any) -> Any:
    if not stream:
        return client.responses.create(**kwargs)
    with client.responses.stream(**kwargs) as events:
        events.until_done()
        return events.get_final_response()


def _sent(upstream: ResponsesServer) -> dict[str, Any]:
    path, _, body = upstream.behaviour.requests[-1]
    assert path == "/v1/responses"
    return body


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_tool_round_trip_goes_to_responses_as_written_and_bills_cached_and_reasoning_tokens(
    setup: tuple[openai.OpenAI, Workflow], upstream: ResponsesServer, stream: bool
) -> None:
    client, workflow = setup
    upstream.behaviour.items = [call_item("call_paris", "get_weather", '{"city":"Paris"}')]
    first_kwargs: dict[str, Any] = {
        "model": workflow.slug,
        "instructions": "Be brief.",
        "input": "Weather in Paris?",
        "tools": [WEATHER],
        "reasoning": {"effort": "low"},
        "max_output_tokens": 64,
        "metadata": {"ticket": "T-1"},
        "store": True,  # Switchyard keeps conversations (under retention), never the provider
    }
    first = _create(client, stream=stream, **first_kwargs)
    sent = _sent(upstream)
    expected = {k: v for k, v in first_kwargs.items() if k != "model"}
    assert sent == {
        **expected,
        "model": "gpt-upstream",
        "store": False,
        **({"stream": True} if stream else {}),
    }
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert (call.call_id, call.name, json.loads(call.arguments)) == (
        "call_paris",
        "get_weather",
        {"city": "Paris"},
    )

    upstream.behaviour.items = [text_item("Sunny, 21 C.")]
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "type": "function_call",
            "call_id": "call_paris",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_paris", "output": "sunny, 21 C"},
    ]
    # As an agent sends the items back: with the ids the previous answer gave them.
    sent_back = [history[0], {**history[1], "id": "fc_sy1", "status": "completed"}, history[2]]
    second = _create(client, stream=stream, model=workflow.slug, input=sent_back, tools=[WEATHER])
    # The items as written, not chat messages; with store false the provider knows no item id.
    assert _sent(upstream)["input"] == history
    assert second.output_text == "Sunny, 21 C." and second.status == "completed"
    assert second.usage.input_tokens == 30 and second.usage.input_tokens_details.cached_tokens == 12
    assert second.usage.output_tokens_details.reasoning_tokens == 3

    row = InferenceRequest.objects.order_by("-pk").first()
    assert row is not None and second.id == f"resp_sy{row.pk}" and row.stream is stream
    ledger_settled()
    billed = {
        r.unit: r.quantity
        for r in UsageRecord.objects.filter(subject_type="inference_request", subject_id=str(row.pk))
    }
    assert billed == {
        Unit.INPUT_TOKENS_1M: Decimal("0.000018"),
        Unit.CACHED_INPUT_TOKENS_1M: Decimal("0.000012"),
        Unit.OUTPUT_TOKENS_1M: Decimal("0.000005"),
        Unit.REASONING_TOKENS_1M: Decimal("0.000003"),
    }


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_an_incomplete_response_stays_incomplete(
    setup: tuple[openai.OpenAI, Workflow], upstream: ResponsesServer, stream: bool
) -> None:
    client, workflow = setup
    upstream.behaviour.status = "incomplete"
    if stream:  # the SDK's accumulator only takes a completed response: read the events
        events = list(client.responses.create(model=workflow.slug, input="Tell me everything.", stream=True))
        assert events[-1].type == "response.incomplete"
        response = events[-1].response  # type: ignore[union-attr]
    else:
        response = client.responses.create(model=workflow.slug, input="Tell me everything.")
    assert response.status == "incomplete"
    assert (
        response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    )


def _target(server: ResponsesServer) -> Target:
    return Target(
        deployment_id=1,
        slug="responses-loopback",
        kind="openai-compatible",
        base_url=server.url,
        provider_model_id="gpt-upstream",
        extra={"responses_api": True},
        allow_private=True,
    )


def test_a_failed_response_is_a_failed_call_with_its_status(upstream: ResponsesServer) -> None:
    request = ChatRequest(
        messages=(ChatMessage(role="user", content="hi"),), responses_wire={"input": "hi", "stream": True}
    )
    upstream.behaviour.fail = "server_error"
    with pytest.raises(ProviderError) as failed:
        list(OpenAICompatibleAdapter().stream(_target(upstream), request, timeout=5))
    assert (failed.value.status_code, failed.value.retryable) == (500, True)
    upstream.behaviour.fail = "rate_limit_exceeded"
    with pytest.raises(ProviderError) as limited:
        list(OpenAICompatibleAdapter().stream(_target(upstream), request, timeout=5))
    assert (limited.value.status_code, limited.value.retryable) == (429, True)
    upstream.behaviour.fail = "image_too_large"  # the request's fault: no other deployment would take it
    with pytest.raises(ProviderError) as refused:
        list(OpenAICompatibleAdapter().stream(_target(upstream), request, timeout=5))
    assert (refused.value.status_code, refused.value.client_error, refused.value.retryable) == (
        400,
        True,
        False,
    )
    # Without the deployment's flag the same request is a chat request, to /chat/completions.
    chat_only = dataclasses.replace(_target(upstream), extra={})
    with pytest.raises(ProviderError):  # this server answers a Response object there: unreadable
        OpenAICompatibleAdapter().complete(chat_only, request, timeout=5)
    assert upstream.behaviour.requests[-1][0] == "/v1/chat/completions"
