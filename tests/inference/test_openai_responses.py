"""OpenAI's Responses API on the gateway, driven by the official `openai` SDK.

The workflow's deployment is a chat-only loopback provider that records what it receives
(tests/inference/recording_provider.py): each test checks the chat body the provider got (the
translated route), what the SDK made of the answer (plain and streamed, through the SDK's own
event accumulator), and the ledger.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import openai
import pytest
from django.contrib.auth.models import User

from billing.models import Unit, UsageRecord
from inference.models import InferenceRequest
from registry.models import Workflow
from registry.services import api_token_create
from tests.factories import make_price
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.inference.recording_provider import RecordingProvider, chat_answer

pytestmark = pytest.mark.django_db(transaction=True)

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
CALL = {
    "id": "call_abc123",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
}
USAGE = {
    "prompt_tokens": 2000,
    "completion_tokens": 300,
    "total_tokens": 2300,
    "prompt_tokens_details": {"cached_tokens": 1536},
    "completion_tokens_details": {"reasoning_tokens": 256},
}
SCHEMA = {
    "type": "json_schema",
    "name": "weather",
    "schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture
def setup(live_server: Any, operator: User, provider: RecordingProvider) -> tuple[openai.OpenAI, Workflow]:
    deployment = priced_deployment(
        base_url=provider.base_url, provider_model_id="provider-model", supports_vision=True
    )
    make_price(unit=Unit.CACHED_INPUT_TOKENS_1M, unit_price=Decimal("0.25"), deployment=deployment)
    make_price(unit=Unit.REASONING_TOKENS_1M, unit_price=Decimal("5"), deployment=deployment)
    workflow = routed_workflow(operator, [deployment])
    _, raw = api_token_create(user=operator, name="responses")
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0), workflow


def _create(client: openai.OpenAI, *, stream: bool, **kwargs: Any) -> Any:
    """The final Response object: as returned, or as the SDK's stream accumulator builds it."""
    if not stream:
        return client.responses.create(**kwargs)
    with client.responses.stream(**kwargs) as events:
        events.until_done()  # every event through the SDK's accumulator
        return events.get_final_response()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_response_is_translated_to_chat_and_back_with_cached_and_reasoning_tokens_billed(
    setup: tuple[openai.OpenAI, Workflow], provider: RecordingProvider, stream: bool
) -> None:
    client, workflow = setup
    provider.script.answer = chat_answer('{"city": "Paris"}', usage=USAGE)
    response = _create(
        client,
        stream=stream,
        model=workflow.slug,
        instructions="Answer in JSON.",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Which city is this?"},
                    {
                        "type": "input_image",
                        "image_url": "data:image/png;base64,iVBORw0KGgo=",
                        "detail": "low",
                    },
                ],
            }
        ],
        max_output_tokens=64,
        temperature=0.5,
        top_p=0.9,
        metadata={"ticket": "T-1"},
        text={"format": SCHEMA},
        reasoning={"effort": "low"},
        store=False,
    )
    assert response.output_text == '{"city": "Paris"}' and response.status == "completed"
    assert response.model == workflow.slug and response.store is False
    assert response.usage.input_tokens == 2000
    assert response.usage.input_tokens_details.cached_tokens == 1536
    assert response.usage.output_tokens_details.reasoning_tokens == 256
    assert response.usage.total_tokens == 2300

    sent = provider.script.last_body
    assert sent["messages"] == [
        {"role": "system", "content": "Answer in JSON."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Which city is this?"},
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"},
                },
            ],
        },
    ]
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "weather", "schema": SCHEMA["schema"], "strict": True},
    }
    assert (sent["max_completion_tokens"], sent["temperature"], sent["top_p"]) == (64, 0.5, 0.9)
    assert (sent["reasoning_effort"], sent["metadata"], sent["model"]) == (
        "low",
        {"ticket": "T-1"},
        "provider-model",
    )
    assert bool(sent.get("stream")) is stream

    row = InferenceRequest.objects.get()
    assert response.id == f"resp_sy{row.pk}" and row.stream is stream
    ledger_settled()
    billed = {
        r.unit: r.quantity
        for r in UsageRecord.objects.filter(subject_type="inference_request", subject_id=str(row.pk))
    }
    assert billed[Unit.CACHED_INPUT_TOKENS_1M] == Decimal("0.001536")
    assert billed[Unit.INPUT_TOKENS_1M] == Decimal("0.000464")
    assert billed[Unit.REASONING_TOKENS_1M] == Decimal("0.000256")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_two_turn_tool_round_trip(
    setup: tuple[openai.OpenAI, Workflow], provider: RecordingProvider, stream: bool
) -> None:
    client, workflow = setup
    provider.script.answer = chat_answer(None, tool_calls=[CALL], finish_reason="tool_calls")
    question = {"role": "user", "content": "What is the weather in Paris?"}
    first = _create(
        client,
        stream=stream,
        model=workflow.slug,
        input=[question],
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert (call.call_id, call.name, json.loads(call.arguments)) == (
        "call_abc123",
        "get_weather",
        {"city": "Paris"},
    )
    sent = provider.script.last_body
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather in a city",
                "parameters": WEATHER["parameters"],
                "strict": True,
            },
        }
    ]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert sent["parallel_tool_calls"] is False

    provider.script.answer = chat_answer("It is 21 °C in Paris.")
    second = _create(
        client,
        stream=stream,
        model=workflow.slug,
        tools=[WEATHER],
        input=[
            question,
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": '{"celsius": 21}'},
        ],
    )
    assert second.output_text == "It is 21 °C in Paris."
    assert provider.script.last_body["messages"] == [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_abc123", "content": '{"celsius": 21}'},
    ]
    assert InferenceRequest.objects.filter(status="succeeded").count() == 2


def test_the_stream_is_the_responses_events_in_order(
    setup: tuple[openai.OpenAI, Workflow], provider: RecordingProvider
) -> None:
    client, workflow = setup
    provider.script.answer = chat_answer("Looking.", tool_calls=[CALL], finish_reason="tool_calls")
    with client.responses.create(
        model=workflow.slug, input="weather?", tools=[WEATHER], stream=True
    ) as events:
        seen = list(events)
    assert [e.sequence_number for e in seen] == list(range(len(seen)))
    assert [e.type for e in seen] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    completed = seen[-1].response
    row = InferenceRequest.objects.get()
    assert completed.id == f"resp_sy{row.pk}" and completed.usage.output_tokens == 5
    assert [item.type for item in completed.output] == ["message", "function_call"]
    assert completed.model_extra["switchyard"]["request_id"] == row.pk  # type: ignore[index]


REFUSED = [
    ("previous_response_id", "resp_123", "previous_response_id"),
    ("background", True, "background"),
    ("tools", [{"type": "web_search"}], "tools[0].type"),
    ("reasoning", {"effort": "low", "summary": "auto"}, "reasoning.summary"),
    ("include", ["reasoning.encrypted_content"], "include"),
    ("truncation", "auto", "truncation"),
    ("input", [{"type": "reasoning", "id": "rs_1", "summary": []}], "input[0].type"),
    ("input", [{"type": "item_reference", "id": "msg_1"}], "input[0].type"),
    ("max_output_tokens", 0, "max_output_tokens"),
    ("text", {"format": {"type": "grammar"}}, "text.format.type"),
    ("tool_choice", "sometimes", "tool_choice"),
    ("nonsense", 1, "nonsense"),
]


@pytest.mark.parametrize(
    ("name", "value", "param"), REFUSED, ids=[f"{r[0]}-{i}" for i, r in enumerate(REFUSED)]
)
def test_what_cannot_be_carried_is_a_400_naming_the_field(
    setup: tuple[openai.OpenAI, Workflow], provider: RecordingProvider, name: str, value: Any, param: str
) -> None:
    client, workflow = setup
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=workflow.slug, input="hi", extra_body={name: value})
    assert refused.value.param == param, refused.value.body
    assert provider.script.calls() == 0 and not InferenceRequest.objects.exists()


def test_an_unknown_response_is_a_404_and_a_bad_key_a_401(setup: tuple[openai.OpenAI, Workflow]) -> None:
    client, _ = setup
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.retrieve("resp_sy1")
    assert missing.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.delete("resp_sy1")
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_sy1")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=str(client.base_url), api_key="sy_bad", max_retries=0).responses.retrieve(
            "resp_sy1"
        )
