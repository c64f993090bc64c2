"""Conformance: /v1 is a drop-in for the provider behind it.

For each feature, the official `openai` SDK sends the same request once straight to a loopback
provider that records what it receives (tests/inference/recording_provider.py) and once through
the gateway; the provider must receive the same body, and the client must get the same result,
ids and the `model` name aside (the gateway names its workflow), streamed and not. The
deployment's provider model id is the one the direct call names, so even `model` matches on the
provider's side.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import openai
import pytest
from django.contrib.auth.models import User
from django.db.models import Sum

from billing.models import UsageRecord
from inference.models import InferenceRequest
from registry.services import api_token_create
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.inference.recording_provider import RecordingProvider, chat_answer

pytestmark = pytest.mark.django_db(transaction=True)

PROVIDER_MODEL = "provider-model"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
CALL = {
    "id": "call_abc123",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
}
USER = {"role": "user", "content": "What is the weather in Paris?"}


def _logprobs(tokens: list[str]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": t,
                "logprob": -0.5 * (i + 1),
                "bytes": list(t.encode()),
                "top_logprobs": [{"token": t, "logprob": -0.5 * (i + 1), "bytes": list(t.encode())}],
            }
            for i, t in enumerate(tokens)
        ],
        "refusal": None,
    }


def _two_choices() -> dict[str, Any]:
    answer = chat_answer("first answer")
    second = json.loads(json.dumps(answer["choices"][0]))
    second["index"] = 1
    second["message"]["content"] = "second answer"
    answer["choices"].append(second)
    return answer


def _with_logprobs() -> dict[str, Any]:
    answer = chat_answer("hello there")
    answer["choices"][0]["logprobs"] = _logprobs(["hello", " there"])
    return answer


def _refusal() -> dict[str, Any]:
    answer = chat_answer(None)
    answer["choices"][0]["message"]["refusal"] = "I can't help with that."
    return answer


def _usage_details() -> dict[str, Any]:
    return chat_answer(
        "thought about it",
        usage={
            "prompt_tokens": 2000,
            "completion_tokens": 300,
            "total_tokens": 2300,
            "prompt_tokens_details": {"cached_tokens": 1536, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 256, "audio_tokens": 0},
        },
    )


# feature: (request keyword arguments, the provider's answer)
FEATURES: dict[str, tuple[dict[str, Any], Callable[[], dict[str, Any]]]] = {
    "tools": (
        {"messages": [USER], "tools": [WEATHER_TOOL], "tool_choice": "auto", "parallel_tool_calls": False},
        lambda: chat_answer(None, tool_calls=[CALL], finish_reason="tool_calls"),
    ),
    "tool_choice_named": (
        {
            "messages": [USER],
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
        lambda: chat_answer(None, tool_calls=[CALL], finish_reason="tool_calls"),
    ),
    "json_schema": (
        {
            "messages": [{"role": "system", "content": "Answer in JSON."}, USER],
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "weather",
                    "strict": True,
                    "schema": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}, "celsius": {"type": "number"}},
                        "required": ["city", "celsius"],
                        "additionalProperties": False,
                    },
                },
            },
        },
        lambda: chat_answer('{"city": "Paris", "celsius": 21}'),
    ),
    "json_object": (
        {"messages": [USER], "response_format": {"type": "json_object"}},
        lambda: chat_answer('{"ok": true}'),
    ),
    "n2": ({"messages": [USER], "n": 2, "temperature": 1.2}, _two_choices),
    "logprobs": ({"messages": [USER], "logprobs": True, "top_logprobs": 1}, _with_logprobs),
    "refusal": ({"messages": [USER]}, _refusal),
    "image_parts": (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is in this image?"},
                        {
                            "type": "image_url",
                            "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"},
                        },
                    ],
                }
            ]
        },
        lambda: chat_answer("a tiny picture"),
    ),
    "sampling_and_metadata": (
        {
            "messages": [{"role": "developer", "content": "Be brief."}, USER],
            "seed": 42,
            "stop": ["\n\n", "END"],
            "user": "end-user-7",
            "metadata": {"ticket": "T-1"},
            "store": False,
            "modalities": ["text"],
            "max_completion_tokens": 64,
            "frequency_penalty": 0.5,
            "presence_penalty": -0.5,
            "logit_bias": {"50256": -100},
            "top_p": 0.9,
        },
        lambda: chat_answer("brief"),
    ),
    "usage_details": ({"messages": [USER], "reasoning_effort": "low"}, _usage_details),
}


@pytest.fixture
def clients(
    live_server: Any, operator: User, provider: RecordingProvider
) -> tuple[openai.OpenAI, openai.OpenAI, str]:
    """(straight to the provider, through /v1, the workflow's name)."""
    deployment = priced_deployment(
        base_url=provider.base_url, provider_model_id=PROVIDER_MODEL, supports_vision=True
    )
    workflow = routed_workflow(operator, [deployment])
    _, raw = api_token_create(user=operator, name="conformance")
    direct = openai.OpenAI(base_url=provider.base_url, api_key="provider-key", max_retries=0)
    via = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0)
    return direct, via, workflow.slug


def _client_view(doc: dict[str, Any]) -> dict[str, Any]:
    """What must match: everything but the ids, the model name and our cost extension."""
    return {k: v for k, v in doc.items() if k not in ("id", "model", "switchyard")}


def _call(client: openai.OpenAI, model: str, kwargs: dict[str, Any], stream: bool) -> list[dict[str, Any]]:
    if not stream:
        return [client.chat.completions.create(model=model, **kwargs).model_dump()]
    with client.chat.completions.create(
        model=model, stream=True, stream_options={"include_usage": True}, **kwargs
    ) as chunks:
        return [chunk.model_dump() for chunk in chunks]


def _both(
    clients: tuple[openai.OpenAI, openai.OpenAI, str],
    provider: RecordingProvider,
    kwargs: dict[str, Any],
    *,
    stream: bool,
) -> list[dict[str, Any]]:
    """Send the request both ways; assert the same provider body and client result."""
    direct, via, workflow = clients
    straight = _call(direct, PROVIDER_MODEL, kwargs, stream)
    sent_direct = provider.script.last_body
    through = _call(via, workflow, kwargs, stream)
    sent_via = provider.script.last_body
    assert sent_via == sent_direct
    assert [_client_view(d) for d in through] == [_client_view(d) for d in straight]
    assert all(d["model"] == workflow for d in through)
    return through


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_the_provider_and_the_client_see_the_same_as_without_the_gateway(
    clients: tuple[openai.OpenAI, openai.OpenAI, str], provider: RecordingProvider, feature: str, stream: bool
) -> None:
    kwargs, answer = FEATURES[feature]
    provider.script.answer = answer()
    through = _both(clients, provider, kwargs, stream=stream)
    for name, value in kwargs.items():
        assert provider.script.last_body[name] == value  # carried, not rebuilt
    if stream:
        # The last event carries the request's cost, as recorded.
        cost = through[-1]["switchyard"]
        row = InferenceRequest.objects.get(pk=cost["request_id"])
        assert Decimal(cost["cost"]) == row.cost > 0 and row.stream


def _assistant_turn(result: list[dict[str, Any]], *, stream: bool) -> dict[str, Any]:
    """The assistant message the client sends back in its next turn."""
    if not stream:
        message = result[0]["choices"][0]["message"]
        return {"role": "assistant", "content": message["content"], "tool_calls": message["tool_calls"]}
    calls: dict[int, dict[str, Any]] = {}
    for chunk in result:
        for choice in chunk["choices"]:
            for delta in choice["delta"].get("tool_calls") or []:
                call = calls.setdefault(
                    delta["index"], {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                call["id"] = delta.get("id") or call["id"]
                function = delta.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
    return {"role": "assistant", "content": None, "tool_calls": [calls[i] for i in sorted(calls)]}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_two_turn_tool_round_trip_is_carried_both_ways(
    clients: tuple[openai.OpenAI, openai.OpenAI, str], provider: RecordingProvider, stream: bool
) -> None:
    first = {"messages": [USER], "tools": [WEATHER_TOOL]}
    provider.script.answer = chat_answer(None, tool_calls=[CALL], finish_reason="tool_calls")
    through = _both(clients, provider, first, stream=stream)
    assistant = _assistant_turn(through, stream=stream)
    assert assistant["tool_calls"][0]["id"] == CALL["id"]
    assert assistant["tool_calls"][0]["function"] == CALL["function"]

    tool_turn = {"role": "tool", "tool_call_id": CALL["id"], "content": '{"celsius": 21}'}
    second = {"messages": [USER, assistant, tool_turn], "tools": [WEATHER_TOOL]}
    provider.script.answer = chat_answer("It is 21 °C in Paris.")
    through = _both(clients, provider, second, stream=stream)
    sent = provider.script.last_body["messages"]
    assert sent[1]["tool_calls"][0]["id"] == CALL["id"] and sent[2] == tool_turn
    if not stream:
        assert through[0]["choices"][0]["message"]["content"] == "It is 21 °C in Paris."

    # Four billed requests; the ledger total is the sum of their costs to the cent.
    rows = InferenceRequest.objects.filter(status="succeeded")
    assert rows.count() == 2
    ledger_settled()
    ledger = UsageRecord.objects.aggregate(total=Sum("amount"))["total"]
    assert ledger == rows.aggregate(total=Sum("cost"))["total"] > 0


def test_a_stream_without_include_usage_gets_no_usage_event_but_is_billed_from_it(
    clients: tuple[openai.OpenAI, openai.OpenAI, str], provider: RecordingProvider
) -> None:
    direct, via, workflow = clients
    kwargs = {"messages": [USER], "tools": [WEATHER_TOOL]}
    provider.script.answer = chat_answer(None, tool_calls=[CALL], finish_reason="tool_calls")
    with direct.chat.completions.create(model=PROVIDER_MODEL, stream=True, **kwargs) as chunks:
        straight = [c.model_dump() for c in chunks]
    with via.chat.completions.create(model=workflow, stream=True, **kwargs) as chunks:
        through = [c.model_dump() for c in chunks]
    assert [_client_view(d) for d in through] == [_client_view(d) for d in straight]
    # The gateway asked for usage to bill what the provider counted (12 in, 5 out).
    assert provider.script.last_body["stream_options"] == {"include_usage": True}
    row = InferenceRequest.objects.get(stream=True)
    assert (row.tokens_in, row.tokens_out) == (12, 5)
    assert Decimal(through[-1]["switchyard"]["cost"]) == row.cost


def test_completions_fields_are_carried_and_answers_come_back_whole(
    clients: tuple[openai.OpenAI, openai.OpenAI, str], provider: RecordingProvider
) -> None:
    direct, via, workflow = clients
    provider.script.answer = {
        "id": "cmpl-provider-1",
        "object": "text_completion",
        "created": 1_700_000_000,
        "model": PROVIDER_MODEL,
        "system_fingerprint": "fp_loopback",
        "choices": [
            {
                "index": 0,
                "text": " world",
                "finish_reason": "length",
                "logprobs": {
                    "tokens": [" world"],
                    "token_logprobs": [-0.1],
                    "top_logprobs": [{" world": -0.1}],
                    "text_offset": [5],
                },
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    kwargs = {
        "prompt": "hello",
        "logprobs": 1,
        "echo": False,
        "suffix": "!",
        "seed": 3,
        "user": "u",
        "max_tokens": 1,
    }
    straight = direct.completions.create(model=PROVIDER_MODEL, **kwargs).model_dump()
    sent_direct = provider.script.last_body
    through = via.completions.create(model=workflow, **kwargs).model_dump()
    assert provider.script.last_body == sent_direct
    assert _client_view(through) == _client_view(straight)
