"""Anthropic's Messages API on the gateway, driven by the official `anthropic` SDK.

The workflow's deployment is an OpenAI-compatible loopback provider that records what it receives
(tests/inference/recording_provider.py): each test checks the chat body the provider got (the
translated route), what the SDK made of the answer (plain and streamed), and the ledger.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import anthropic
import pytest
from django.contrib.auth.models import User
from django.test import Client

from billing.models import Unit, UsageRecord
from inference.admission import input_tokens
from inference.gateway.translated.messages_request import messages_request_parse
from inference.models import InferenceRequest
from registry.models import Workflow
from registry.services import api_token_create
from tests.factories import make_price
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.inference.recording_provider import RecordingProvider, chat_answer

pytestmark = pytest.mark.django_db(transaction=True)

WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL = {
    "id": "call_abc123",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
}
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
USAGE = {
    "prompt_tokens": 2000,
    "completion_tokens": 40,
    "total_tokens": 2040,
    "prompt_tokens_details": {"cached_tokens": 1536, "cache_write_tokens": 200},
}


@pytest.fixture
def setup(
    live_server: Any, operator: User, provider: RecordingProvider
) -> tuple[anthropic.Anthropic, Workflow, str]:
    """(an SDK client on the gateway, the workflow, the raw key)."""
    deployment = priced_deployment(
        base_url=provider.base_url, provider_model_id="provider-model", supports_vision=True
    )
    make_price(unit=Unit.CACHED_INPUT_TOKENS_1M, unit_price=Decimal("0.25"), deployment=deployment)
    workflow = routed_workflow(operator, [deployment])
    _, raw = api_token_create(user=operator, name="anthropic")
    client = anthropic.Anthropic(base_url=live_server.url, api_key=raw, max_retries=0)
    return client, workflow, raw


def _final_streamed(client: anthropic.Anthropic, **kwargs: Any) -> tuple[str, Any]:
    with client.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        return text, stream.get_final_message()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_message_is_translated_to_chat_and_its_answer_back_with_cached_tokens_billed(
    setup: tuple[anthropic.Anthropic, Workflow, str], provider: RecordingProvider, stream: bool
) -> None:
    client, workflow, _ = setup
    provider.script.answer = chat_answer("It is sunny.", usage=USAGE)
    kwargs: dict[str, Any] = {
        "model": workflow.slug,
        "max_tokens": 64,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [QUESTION],
        "stop_sequences": ["END"],
        "metadata": {"user_id": "end-user-7"},
        "output_config": {"effort": "low"},
        # Sampling fields of the Messages API before SDK 1.x dropped them; older clients send them.
        "extra_body": {"temperature": 0.5, "top_p": 0.9},
    }
    if stream:
        text, message = _final_streamed(client, **kwargs)
        assert text == "It is sunny."
    else:
        message = client.messages.create(**kwargs)
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == "It is sunny."
    assert message.stop_reason == "end_turn" and message.model == workflow.slug
    # 2000 prompt tokens less the 1536 read from the cache and the 200 written to it
    assert message.usage.input_tokens == 264
    assert message.usage.cache_read_input_tokens == 1536
    assert message.usage.cache_creation_input_tokens == 200
    assert message.usage.output_tokens == 40

    sent = provider.script.last_body
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    assert (sent["model"], sent["max_tokens"], sent["stop"], sent["user"]) == (
        "provider-model",
        64,
        ["END"],
        "end-user-7",
    )
    assert (sent["temperature"], sent["top_p"], sent["reasoning_effort"]) == (0.5, 0.9, "low")
    assert bool(sent.get("stream")) is stream

    row = InferenceRequest.objects.get()
    assert message.id == f"msg_sy{row.pk}" and row.endpoint == "chat" and row.stream is stream
    ledger_settled()
    billed = {
        r.unit: r.quantity
        for r in UsageRecord.objects.filter(subject_type="inference_request", subject_id=str(row.pk))
    }
    # Cache writes have no price unit of their own: billed with the uncached input.
    assert billed == {
        Unit.INPUT_TOKENS_1M: Decimal("0.000464"),
        Unit.CACHED_INPUT_TOKENS_1M: Decimal("0.001536"),
        Unit.OUTPUT_TOKENS_1M: Decimal("0.000040"),
    }


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_two_turn_tool_round_trip(
    setup: tuple[anthropic.Anthropic, Workflow, str], provider: RecordingProvider, stream: bool
) -> None:
    client, workflow, _ = setup
    provider.script.answer = chat_answer(None, tool_calls=[CALL], finish_reason="tool_calls")
    first: dict[str, Any] = {
        "model": workflow.slug,
        "max_tokens": 128,
        "messages": [QUESTION],
        "tools": [WEATHER],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    }
    message = _final_streamed(client, **first)[1] if stream else client.messages.create(**first)
    assert message.stop_reason == "tool_use"
    (use,) = message.content
    assert (use.type, use.id, use.name, use.input) == (
        "tool_use",
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
                "parameters": WEATHER["input_schema"],
                "description": "Current weather in a city",
            },
        }
    ]
    assert (sent["tool_choice"], sent["parallel_tool_calls"]) == ("required", False)

    provider.script.answer = chat_answer("It is 21 °C in Paris.")
    second = {
        **first,
        "tool_choice": {"type": "auto"},
        "messages": [
            QUESTION,
            {"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": '{"celsius": 21}'},
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
    }
    message = _final_streamed(client, **second)[1] if stream else client.messages.create(**second)
    assert message.content[0].text == "It is 21 °C in Paris."
    sent = provider.script.last_body
    assert sent["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{**CALL, "function": {**CALL["function"], "arguments": '{"city": "Paris"}'}}],
        },
        {"role": "tool", "tool_call_id": "call_abc123", "content": '{"celsius": 21}'},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert sent["tool_choice"] == "auto" and "parallel_tool_calls" not in sent
    assert InferenceRequest.objects.filter(status="succeeded").count() == 2


def test_the_stream_is_anthropics_events_in_order_and_the_last_delta_carries_the_cost(
    setup: tuple[anthropic.Anthropic, Workflow, str], provider: RecordingProvider
) -> None:
    client, workflow, raw = setup
    provider.script.answer = chat_answer("Looking it up.", tool_calls=[CALL], finish_reason="tool_calls")
    response = client.messages.with_raw_response.create(
        model=workflow.slug, max_tokens=64, messages=[QUESTION], tools=[WEATHER], stream=True
    )
    events = []
    name = None
    for line in response.http_response.iter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            doc = json.loads(line.removeprefix("data: "))
            assert doc["type"] == name
            events.append(doc)
    kinds = [e["type"] for e in events]
    assert kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 3,  # the loopback provider streams the text word by word
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[1]["content_block"] == {"type": "text", "text": ""}
    assert "".join(e["delta"].get("text", "") for e in events[2:5]) == "Looking it up."
    assert events[6]["content_block"] == {
        "type": "tool_use",
        "id": "call_abc123",
        "name": "get_weather",
        "input": {},
    }
    assert "".join(e["delta"].get("partial_json", "") for e in events[7:9]) == '{"city":"Paris"}'
    delta = events[-2]
    row = InferenceRequest.objects.get()
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert delta["usage"]["output_tokens"] == 5
    assert delta["switchyard"]["request_id"] == row.pk
    assert Decimal(delta["switchyard"]["cost"]) == row.cost > 0


def test_count_tokens_estimates_without_calling_a_provider(
    setup: tuple[anthropic.Anthropic, Workflow, str], provider: RecordingProvider
) -> None:
    client, workflow, _ = setup
    body: dict[str, Any] = {
        "model": workflow.slug,
        "messages": [QUESTION],
        "system": "Be brief.",
        "tools": [WEATHER],
    }
    counted = client.messages.count_tokens(**body)
    assert counted.input_tokens == input_tokens(messages_request_parse(body, counting=True).request) > 0
    assert provider.script.calls() == 0 and not InferenceRequest.objects.exists()


# (field, value, the param the 400 names): each is refused before any provider is called.
REFUSED = [
    ("top_k", 5, "top_k"),
    ("thinking", {"type": "enabled", "budget_tokens": 1024}, "thinking"),
    ("frequency_penalty", 0.5, "frequency_penalty"),
    ("temperature", 1.5, "temperature"),
    ("max_tokens", 0, "max_tokens"),
    ("metadata", {"tenant": "a"}, "metadata.tenant"),
    ("tools", [{"type": "web_search_20250305", "name": "web_search"}], "tools[0].type"),
    ("tool_choice", {"type": "sometimes"}, "tool_choice.type"),
    ("stop_sequences", ["a", "b", "c", "d", "e"], "stop_sequences"),
    (
        "messages",
        [{"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "x"}}]}],
        "messages[0].content[0].type",
    ),
    (
        "messages",
        [
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [
                            {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}}
                        ],
                    }
                ],
            }
        ],
        "messages[0].content[0].content[0]",
    ),
    ("messages", [{"role": "system", "content": "hi"}], "messages[0].role"),
]


@pytest.mark.parametrize(
    ("name", "value", "param"), REFUSED, ids=[f"{r[0]}-{i}" for i, r in enumerate(REFUSED)]
)
def test_what_cannot_be_carried_is_a_400_naming_the_field(
    setup: tuple[anthropic.Anthropic, Workflow, str],
    provider: RecordingProvider,
    name: str,
    value: Any,
    param: str,
) -> None:
    client, workflow, _ = setup
    with pytest.raises(anthropic.BadRequestError) as refused:
        # extra_body is merged over the typed fields: the SDK sends the value as it is
        client.messages.create(
            model=workflow.slug, max_tokens=16, messages=[QUESTION], extra_body={name: value}
        )
    error = refused.value.body
    assert isinstance(error, dict) and error["type"] == "error"
    assert error["error"]["type"] == "invalid_request_error" and error["error"]["param"] == param
    assert provider.script.calls() == 0 and not InferenceRequest.objects.exists()


def test_keys_versions_and_unknown_models_answer_as_anthropics_api_does(
    setup: tuple[anthropic.Anthropic, Workflow, str], provider: RecordingProvider, live_server: Any
) -> None:
    client, workflow, raw = setup
    body: dict[str, Any] = {"model": workflow.slug, "max_tokens": 16, "messages": [QUESTION]}
    with pytest.raises(anthropic.AuthenticationError) as bad_key:
        anthropic.Anthropic(base_url=live_server.url, api_key="sy_not_a_key", max_retries=0).messages.create(
            **body
        )
    assert bad_key.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(**{**body, "model": "no-such-workflow"})
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as version:
        client.messages.create(**body, extra_headers={"anthropic-version": "2020-01-01"})
    assert version.value.body["error"]["param"] == "anthropic-version"  # type: ignore[index]
    assert provider.script.calls() == 0

    # The same key works as a bearer token, and x-api-key works on the OpenAI paths too.
    bearer = anthropic.Anthropic(base_url=live_server.url, auth_token=raw, max_retries=0)
    assert bearer.messages.create(**body).content[0].text == "hello there"  # type: ignore[union-attr]
    models = Client(HTTP_X_API_KEY=raw).get("/v1/models")
    assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == [workflow.slug]
