"""Tools and JSON mode through /v1 to a Bedrock deployment: the official `openai` SDK against the
live gateway, whose Bedrock adapter calls the loopback Converse server (boto3's endpoint_url).

Each test asserts both sides: the Converse body the server received (toolConfig, toolUse and
toolResult blocks) and what the SDK got back (tool_calls, JSON content, finish_reason), streamed
and not; and the ledger still bills the tokens Converse reported.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import openai
import pytest
from django.contrib.auth.models import User
from django.db.models import Sum

from billing.models import UsageRecord
from inference.models import InferenceRequest
from registry.models import Deployment, Provider
from registry.services import api_token_create, provider_set_credentials
from tests.factories import make_provider
from tests.helpers import ledger_settled
from tests.inference.converse_server import ConverseServer
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db(transaction=True)

PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": PARAMETERS,
        "strict": True,
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time"}}
WEATHER_SPEC = {
    "toolSpec": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "inputSchema": {"json": PARAMETERS},
        "strict": True,
    }
}
TIME_SPEC = {"toolSpec": {"name": "get_time", "inputSchema": {"json": {"type": "object", "properties": {}}}}}
SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Weather in Paris and Lyon?"}
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "celsius": {"type": "number"}},
    "required": ["city", "celsius"],
    "additionalProperties": False,
}


def _use(ident: str, name: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"toolUse": {"toolUseId": ident, "name": name, "input": value}}


@pytest.fixture
def converse() -> Iterator[ConverseServer]:
    server = ConverseServer()
    yield server
    server.stop()


@pytest.fixture
def bedrock(converse: ConverseServer) -> Deployment:
    provider = make_provider(kind=Provider.Kind.BEDROCK, base_url=converse.url, region="eu-west-1")
    provider_set_credentials(provider=provider, credentials="AKIDTEST:not-a-real-secret")
    return priced_deployment(provider=provider, provider_model_id="anthropic.claude-test")


@pytest.fixture
def sdk(live_server: Any, operator: User, bedrock: Deployment) -> tuple[openai.OpenAI, str]:
    """(a client of /v1, the workflow routed to the Bedrock deployment)."""
    workflow = routed_workflow(operator, [bedrock])
    _, raw = api_token_create(user=operator, name="bedrock-tools")
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0), workflow.slug


def _ask(sdk: tuple[openai.OpenAI, str], *, stream: bool, **kwargs: Any) -> dict[str, Any]:
    """The answer's message and finish_reason as the SDK gives them; a stream is reassembled
    (content pieces joined, tool-call deltas merged by index) as an agent framework does."""
    client, workflow = sdk
    if not stream:
        choice = client.chat.completions.create(model=workflow, **kwargs).choices[0]
        message = choice.message.model_dump(exclude_none=True)
        return {"message": message, "finish_reason": choice.finish_reason, "chunks": None}
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    with client.chat.completions.create(model=workflow, stream=True, **kwargs) as events:
        chunks = [event.model_dump() for event in events]
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content.append(delta.get("content") or "")
            for part in delta.get("tool_calls") or []:
                call = calls.setdefault(part["index"], {"function": {"name": "", "arguments": ""}})
                if part.get("id"):
                    assert "id" not in call  # id, type and name come once, on the call's first delta
                    call.update(id=part["id"], type=part["type"])
                    call["function"]["name"] = part["function"]["name"]
                call["function"]["arguments"] += part["function"].get("arguments") or ""
            finish = choice["finish_reason"] or finish
    message: dict[str, Any] = {"role": "assistant"}
    if "".join(content):
        message["content"] = "".join(content)
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {"message": message, "finish_reason": finish, "chunks": chunks}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_two_turn_tool_round_trip_maps_to_converse_and_back(
    sdk: tuple[openai.OpenAI, str], converse: ConverseServer, stream: bool
) -> None:
    converse.behaviour.blocks = [
        {"text": "Looking both up."},
        _use("tooluse_paris", "get_weather", {"city": "Paris"}),
        _use("tooluse_lyon", "get_weather", {"city": "Lyon"}),
    ]
    converse.behaviour.stop_reason = "tool_use"
    first = _ask(
        sdk, stream=stream, messages=[SYSTEM, USER], tools=[WEATHER_TOOL, TIME_TOOL], tool_choice="auto"
    )

    path, body = converse.behaviour.requests[-1]
    assert path == f"/model/anthropic.claude-test/{'converse-stream' if stream else 'converse'}"
    assert body["system"] == [{"text": "Be brief."}]
    assert body["messages"] == [{"role": "user", "content": [{"text": "Weather in Paris and Lyon?"}]}]
    assert body["toolConfig"] == {"tools": [WEATHER_SPEC, TIME_SPEC], "toolChoice": {"auto": {}}}

    assistant = first["message"]
    assert first["finish_reason"] == "tool_calls"
    assert assistant["content"] == "Looking both up."
    calls = assistant["tool_calls"]
    assert [(c["id"], c["type"], c["function"]["name"]) for c in calls] == [
        ("tooluse_paris", "function", "get_weather"),
        ("tooluse_lyon", "function", "get_weather"),
    ]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}, {"city": "Lyon"}]

    # Turn two: the assistant's turn as the SDK gave it, and one tool message per call.
    converse.behaviour.blocks = None
    converse.behaviour.text = "Paris 21 °C, Lyon 19 °C."
    converse.behaviour.stop_reason = "end_turn"
    results = [
        {"role": "tool", "tool_call_id": "tooluse_paris", "content": '{"celsius": 21}'},
        {"role": "tool", "tool_call_id": "tooluse_lyon", "content": "19 degrees"},
    ]
    second = _ask(sdk, stream=stream, messages=[SYSTEM, USER, assistant, *results], tools=[WEATHER_TOOL])
    assert second["message"]["content"] == "Paris 21 °C, Lyon 19 °C."
    assert second["finish_reason"] == "stop"
    assert converse.behaviour.last_body()["messages"] == [
        {"role": "user", "content": [{"text": "Weather in Paris and Lyon?"}]},
        {
            "role": "assistant",
            "content": [
                {"text": "Looking both up."},
                _use("tooluse_paris", "get_weather", {"city": "Paris"}),
                _use("tooluse_lyon", "get_weather", {"city": "Lyon"}),
            ],
        },
        # Both results in one user message: Converse wants the roles to alternate.
        {
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": "tooluse_paris", "content": [{"json": {"celsius": 21}}]}},
                {"toolResult": {"toolUseId": "tooluse_lyon", "content": [{"text": "19 degrees"}]}},
            ],
        },
    ]
    assert converse.behaviour.last_body()["toolConfig"] == {"tools": [WEATHER_SPEC]}  # no tool_choice sent

    ledger_settled()
    # Both turns billed at Converse's counts (11 in, 4 out); the ledger is the sum of the costs.
    rows = InferenceRequest.objects.filter(status="succeeded", stream=stream)
    assert sorted(rows.values_list("tokens_in", "tokens_out")) == [(11, 4), (11, 4)]
    assert all(r.cost == Decimal("0.000023000") for r in rows)
    ledger = UsageRecord.objects.aggregate(total=Sum("amount"))["total"]
    assert ledger == rows.aggregate(total=Sum("cost"))["total"]
    if stream:
        # The stream's last event carries the recorded cost; usage was not asked for, so none came.
        assert Decimal(second["chunks"][-1]["switchyard"]["cost"]) == Decimal("0.000023000")
        assert all(c.get("usage") is None for c in second["chunks"])


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_json_schema_mode_is_one_forced_tool_whose_input_is_the_content(
    sdk: tuple[openai.OpenAI, str], converse: ConverseServer, stream: bool
) -> None:
    converse.behaviour.blocks = [_use("tooluse_1", "weather", {"city": "Paris", "celsius": 21})]
    converse.behaviour.stop_reason = "tool_use"
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "strict": True, "schema": SCHEMA}}
    options = {"stream_options": {"include_usage": True}} if stream else {}
    answer = _ask(sdk, stream=stream, messages=[USER], response_format=fmt, **options)

    assert converse.behaviour.last_body()["toolConfig"] == {
        "tools": [
            {
                "toolSpec": {
                    "name": "weather",
                    "inputSchema": {"json": SCHEMA},
                    "strict": True,
                    "description": "Give the final answer as this tool's input: "
                    "a JSON value that follows its schema.",
                }
            }
        ],
        "toolChoice": {"tool": {"name": "weather"}},
    }
    assert "tool_calls" not in answer["message"]
    assert json.loads(answer["message"]["content"]) == {"city": "Paris", "celsius": 21}
    assert answer["finish_reason"] == "stop"
    if stream:
        # Asked for, the usage event comes last (no choices), as OpenAI sends it.
        last = answer["chunks"][-1]
        assert last["choices"] == []
        assert (last["usage"]["prompt_tokens"], last["usage"]["completion_tokens"]) == (11, 4)
    row = InferenceRequest.objects.get()
    assert (row.tokens_in, row.tokens_out, row.stream) == (11, 4, stream)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_json_object_mode_uses_a_permissive_object_schema(
    sdk: tuple[openai.OpenAI, str], converse: ConverseServer, stream: bool
) -> None:
    converse.behaviour.blocks = [_use("tooluse_1", "json_object", {"ok": True, "items": [1, 2]})]
    converse.behaviour.stop_reason = "tool_use"
    answer = _ask(sdk, stream=stream, messages=[USER], response_format={"type": "json_object"})
    config = converse.behaviour.last_body()["toolConfig"]
    assert config["tools"][0]["toolSpec"]["inputSchema"] == {"json": {"type": "object"}}
    assert config["toolChoice"] == {"tool": {"name": "json_object"}}
    assert json.loads(answer["message"]["content"]) == {"ok": True, "items": [1, 2]}


@pytest.mark.parametrize(
    ("tool_choice", "expected"),
    [
        ("auto", {"auto": {}}),
        ("required", {"any": {}}),
        ({"type": "function", "function": {"name": "get_weather"}}, {"tool": {"name": "get_weather"}}),
    ],
    ids=["auto", "required", "named"],
)
def test_tool_choice_maps_to_converse_tool_choice(
    sdk: tuple[openai.OpenAI, str], converse: ConverseServer, tool_choice: Any, expected: dict[str, Any]
) -> None:
    _ask(sdk, stream=False, messages=[USER], tools=[WEATHER_TOOL, TIME_TOOL], tool_choice=tool_choice)
    assert converse.behaviour.last_body()["toolConfig"] == {
        "tools": [WEATHER_SPEC, TIME_SPEC],
        "toolChoice": expected,
    }


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_tool_choice_none_sends_no_tool_config_and_the_history_as_text(
    sdk: tuple[openai.OpenAI, str], converse: ConverseServer, stream: bool
) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }
    messages = [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'},
    ]
    answer = _ask(sdk, stream=stream, messages=messages, tools=[WEATHER_TOOL], tool_choice="none")
    assert answer["message"]["content"] == "hello from bedrock"
    body = converse.behaviour.last_body()
    assert "toolConfig" not in body
    assert body["messages"] == [
        {"role": "user", "content": [{"text": "Weather in Paris and Lyon?"}]},
        {"role": "assistant", "content": [{"text": '[tool call call_1: get_weather({"city":"Paris"})]'}]},
        {"role": "user", "content": [{"text": '[result of tool call call_1]\n{"celsius": 21}'}]},
    ]


def test_tools_with_json_schema_let_the_model_call_a_tool_or_answer_in_json(
    sdk: tuple[openai.OpenAI, str], converse: ConverseServer
) -> None:
    converse.behaviour.blocks = [_use("tooluse_1", "weather", {"city": "Paris", "celsius": 21})]
    converse.behaviour.stop_reason = "tool_use"
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}}
    answer = _ask(sdk, stream=False, messages=[USER], tools=[WEATHER_TOOL], response_format=fmt)
    config = converse.behaviour.last_body()["toolConfig"]
    assert [t["toolSpec"]["name"] for t in config["tools"]] == ["get_weather", "weather"]
    assert config["toolChoice"] == {"any": {}}
    assert json.loads(answer["message"]["content"]) == {"city": "Paris", "celsius": 21}
    assert answer["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_parallel_tool_calls_false_hands_back_only_the_first_call(
    sdk: tuple[openai.OpenAI, str], converse: ConverseServer, stream: bool
) -> None:
    converse.behaviour.blocks = [
        _use("tooluse_paris", "get_weather", {"city": "Paris"}),
        _use("tooluse_lyon", "get_weather", {"city": "Lyon"}),
    ]
    converse.behaviour.stop_reason = "tool_use"
    answer = _ask(sdk, stream=stream, messages=[USER], tools=[WEATHER_TOOL], parallel_tool_calls=False)
    assert [c["id"] for c in answer["message"]["tool_calls"]] == ["tooluse_paris"]
    assert answer["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_tool_call_arguments_that_are_not_a_json_object_are_a_400_before_any_call(
    sdk: tuple[openai.OpenAI, str], converse: ConverseServer, stream: bool
) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": "{city: Paris"},
    }
    messages = [
        USER,
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "x"},
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(sdk, stream=stream, messages=messages, tools=[WEATHER_TOOL])
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "unsupported_feature"
    assert "tool call arguments that are not a JSON object" in error["message"]
    assert converse.behaviour.requests == []


def test_a_request_botocore_refuses_is_a_client_error_not_a_failover(
    sdk: tuple[openai.OpenAI, str], converse: ConverseServer
) -> None:
    # An empty tool call id is below Converse's minimum length: botocore refuses it unsent.
    call = {"id": "", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    messages = [
        USER,
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "", "content": "x"},
    ]
    with pytest.raises(openai.BadRequestError):
        _ask(sdk, stream=False, messages=messages, tools=[WEATHER_TOOL])
    assert converse.behaviour.requests == []
    ledger_settled()
    attempt = InferenceRequest.objects.get().attempt_rows.get()
    assert (attempt.outcome, attempt.status_code) == ("non_retryable", 400)


def test_images_are_still_refused_with_a_400(
    sdk: tuple[openai.OpenAI, str], converse: ConverseServer
) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    with pytest.raises(openai.BadRequestError):
        _ask(sdk, stream=False, messages=[{"role": "user", "content": [image]}])
    assert converse.behaviour.requests == []


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_field_converse_cannot_carry_is_named_in_the_400(
    sdk: tuple[openai.OpenAI, str], converse: ConverseServer, stream: bool
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(sdk, stream=stream, messages=[USER], logprobs=True, n=2, seed=7, reasoning_effort="low")
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "provider_rejected"
    assert "Bedrock Converse: does not take logprobs, n, reasoning_effort, seed" in error["message"]
    assert converse.behaviour.requests == []


def test_accounting_fields_and_no_op_defaults_are_left_out_not_refused(
    sdk: tuple[openai.OpenAI, str], converse: ConverseServer
) -> None:
    answer = _ask(
        sdk,
        stream=False,
        messages=[USER],
        user="end-user-7",
        metadata={"ticket": "T-1"},
        store=False,
        n=1,
        presence_penalty=0,
        logprobs=False,
    )
    assert answer["message"]["content"] == "hello from bedrock"
    assert set(converse.behaviour.last_body()) == {"messages"}  # nothing else reached Converse
