"""The OpenAI <-> Converse mapping on its own (pure Python: no server, no database): the requests
it refuses with the field named, and the stream events it makes."""

from __future__ import annotations

from typing import Any

import pytest

from inference.adapters.base import ChatMessage, ChatRequest, request_features
from inference.adapters.converse_mapping import (
    ConversePlan,
    ConverseStreamMapper,
    Unmappable,
    chat_answer,
    converse_request,
)

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
HI = ChatMessage("user", "hi")


def _plan(**fields: Any) -> ConversePlan:
    fields.setdefault("messages", (HI,))
    return converse_request(ChatRequest(**fields), model_id="m")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tool_choice": "required"}, "tool_choice required needs tools"),
        (
            {"tools": (TOOL,), "tool_choice": {"type": "function", "function": {"name": "other"}}},
            "not one of",
        ),
        ({"tools": (TOOL,), "tool_choice": {"type": "allowed_tools"}}, "must name a function"),
        ({"tools": ({"type": "custom", "custom": {"name": "x"}},)}, "tools[0].type must be function"),
        ({"tools": ({"type": "function", "function": {"name": "has space"}},)}, "tools[0].function.name"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}}, "json_schema.name"),
        (
            {"tools": (TOOL,), "response_format": {"type": "json_schema", "json_schema": {"name": "lookup"}}},
            "also a tool's",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ],
)
def test_what_converse_cannot_express_is_refused_naming_the_field(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(Unmappable, match=message.replace("[", r"\[").replace("]", r"\]")):
        _plan(**fields)


def test_roles_map_to_system_and_alternating_messages() -> None:
    plan = _plan(
        messages=(
            ChatMessage("developer", "be brief"),
            HI,
            ChatMessage("user", "again"),
            ChatMessage("assistant", "yes"),
        )
    )
    assert plan.args["system"] == [{"text": "be brief"}]
    assert plan.args["messages"] == [
        {"role": "user", "content": [{"text": "hi"}, {"text": "again"}]},
        {"role": "assistant", "content": [{"text": "yes"}]},
    ]
    assert "toolConfig" not in plan.args


def test_empty_arguments_are_an_empty_input_and_other_json_is_not_an_object() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": ""}}
    plan = _plan(tools=(TOOL,), messages=(HI, ChatMessage("assistant", "", tool_calls=(call,))))
    assert plan.args["messages"][1]["content"] == [
        {"toolUse": {"toolUseId": "c1", "name": "lookup", "input": {}}}
    ]
    listed = {**call, "function": {"name": "lookup", "arguments": "[1, 2]"}}
    request = ChatRequest(messages=(HI, ChatMessage("assistant", "", tool_calls=(listed,))), tools=(TOOL,))
    assert "tool call arguments that are not a JSON object" in request_features(request)
    with pytest.raises(Unmappable, match=r"messages\[1\].tool_calls\[0\].function.arguments"):
        converse_request(request, model_id="m")


def test_a_converse_answer_becomes_an_openai_document() -> None:
    plan = _plan(tools=(TOOL,))
    doc = {
        "output": {
            "message": {
                "role": "assistant",
                "content": [{"toolUse": {"toolUseId": "t1", "name": "lookup", "input": {"q": "é"}}}],
            }
        },
        "stopReason": "tool_use",
        "usage": {"inputTokens": 3, "outputTokens": 2},
    }
    text, finish, raw = chat_answer(doc, plan, model="m")
    assert (text, finish) == ("", "tool_calls")
    assert raw["choices"][0]["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "lookup", "arguments": '{"q":"é"}'}}
        ],
    }
    assert raw["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


def test_stream_events_become_openai_chunks() -> None:
    plan = _plan(tools=(TOOL,), response_format={"type": "json_object"})
    assert plan.json_tool == "json_object" and plan.args["toolConfig"]["toolChoice"] == {"any": {}}
    mapper = ConverseStreamMapper(plan, model="m")
    events: list[dict[str, Any]] = [
        {"messageStart": {"role": "assistant"}},
        {
            "contentBlockStart": {
                "contentBlockIndex": 0,
                "start": {"toolUse": {"toolUseId": "t1", "name": "lookup"}},
            }
        },
        {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"toolUse": {"input": '{"q":'}}}},
        {"contentBlockDelta": {"contentBlockIndex": 0, "delta": {"toolUse": {"input": '"x"}'}}}},
        {"contentBlockStop": {"contentBlockIndex": 0}},
        {
            "contentBlockStart": {
                "contentBlockIndex": 1,
                "start": {"toolUse": {"toolUseId": "t2", "name": "json_object"}},
            }
        },
        {"contentBlockDelta": {"contentBlockIndex": 1, "delta": {"toolUse": {"input": '{"a": 1}'}}}},
        {"contentBlockDelta": {"contentBlockIndex": 1, "delta": {"reasoningContent": {"text": "hm"}}}},
        {"messageStop": {"stopReason": "tool_use"}},
        {"metadata": {"usage": {"inputTokens": 5, "outputTokens": 6}}},
    ]
    chunks = [c for c in (mapper.event(e) for e in events) if c is not None]
    deltas = [c.raw["choices"][0]["delta"] if c.raw and c.raw["choices"] else None for c in chunks]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {
            "tool_calls": [
                {"index": 0, "id": "t1", "type": "function", "function": {"name": "lookup", "arguments": ""}}
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"q":'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"x"}'}}]},
        {"content": '{"a": 1}'},
        {},
        None,
    ]
    assert chunks[4].text == '{"a": 1}'
    assert chunks[-2].finish_reason == "tool_calls"
    last = chunks[-1]
    assert (last.tokens_in, last.tokens_out, last.finish_reason) == (5, 6, "tool_calls")
    assert last.raw is not None and last.raw["usage"]["total_tokens"] == 11
