"""The agents' APIs' translators on their own (no server): request shapes a client sends and the
chat body they become, and provider answers of every shape the chat route passes on, plain and
streamed, as the client's API writes them."""

from __future__ import annotations

import json
from typing import Any

from inference.gateway.translated.messages_answer import MessagesStream, chat_to_message
from inference.gateway.translated.messages_request import messages_to_chat
from inference.gateway.translated.responses_answer import ResponsesStream, chat_to_response
from inference.gateway.translated.responses_request import responses_to_chat


def _events(raw: list[bytes]) -> list[dict[str, Any]]:
    docs = []
    for event in raw:
        name, data = event.decode().split("\n", 1)
        doc = json.loads(data.removeprefix("data: "))
        assert name == f"event: {doc['type']}"
        docs.append(doc)
    return docs


def _messages_stream(chunks: list[dict[str, Any]], *, broken: bool = False) -> list[dict[str, Any]]:
    stream = MessagesStream(7, "wf")
    raw = [*stream.start()]
    for chunk in chunks:
        raw += stream.feed(chunk)
    raw += stream.end(None, broken=broken)
    return _events(raw)


def _responses_stream(chunks: list[dict[str, Any]], *, broken: bool = False) -> list[dict[str, Any]]:
    stream = ResponsesStream(7, "wf", {"input": "x"})
    raw = [*stream.start()]
    for chunk in chunks:
        raw += stream.feed(chunk)
    raw += stream.end(None, broken=broken)
    return _events(raw)


def _delta(**delta: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def test_text_blocks_stay_apart_and_a_tool_error_is_marked() -> None:
    chat = messages_to_chat(
        {
            "model": "wf",
            "max_tokens": 8,
            "system": [
                {"type": "text", "text": "You are a bot."},
                {"type": "text", "text": "Today is Monday."},
            ],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "<reminder>x</reminder>"},
                        {"type": "text", "text": "Hello"},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": "boom"}
                    ],
                },
            ],
        }
    )
    assert chat["messages"][0]["content"] == [
        {"type": "text", "text": "You are a bot."},
        {"type": "text", "text": "Today is Monday."},
    ]
    assert chat["messages"][1]["content"] == [
        {"type": "text", "text": "<reminder>x</reminder>"},
        {"type": "text", "text": "Hello"},
    ]
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "t1", "content": "Error: boom"}


def test_an_assistant_refusal_fed_back_to_responses_is_carried_as_its_text() -> None:
    answer = chat_to_response(
        {"choices": [{"message": {"content": None, "refusal": "I can't help"}, "finish_reason": "stop"}]},
        request_id=3,
        model="wf",
        request={},
    )
    assert answer["output"][0]["content"] == [{"type": "refusal", "refusal": "I can't help"}]
    chat = responses_to_chat({"model": "wf", "input": [{"role": "user", "content": "hi"}, *answer["output"]]})
    assert chat["messages"][1] == {"role": "assistant", "content": "I can't help"}


def test_odd_provider_shapes_are_read_not_crashed_on() -> None:
    """Content as parts and arguments as an object, as some OpenAI-style providers send them."""
    chat = {
        "choices": [
            {
                "message": {
                    "content": [{"type": "text", "text": "Looking."}],
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 8}},
    }
    message = chat_to_message(chat, request_id=1, model="wf")
    assert message["content"] == [
        {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}},
    ]
    assert message["usage"]["input_tokens"] == 0  # never negative, whatever the provider counted
    response = chat_to_response(chat, request_id=1, model="wf", request={})
    assert [i["type"] for i in response["output"]] == ["message", "function_call"]
    assert json.loads(response["output"][1]["arguments"]) == {"a": 1}
    stream = [
        _delta(content=[{"type": "text", "text": "Look"}]),
        _delta(tool_calls=[{"id": "c1", "function": {"name": "f", "arguments": {"a": 1}}}]),
    ]
    blocks = [e for e in _messages_stream(stream) if e["type"] == "content_block_delta"]
    assert blocks[0]["delta"] == {"type": "text_delta", "text": "Look"}
    assert blocks[1]["delta"] == {"type": "input_json_delta", "partial_json": '{"a": 1}'}
    done = _responses_stream(stream)[-1]["response"]
    assert [i["type"] for i in done["output"]] == ["message", "function_call"]


def test_streamed_tool_calls_without_an_index_are_told_apart_by_their_id() -> None:
    stream = [
        _delta(tool_calls=[{"id": "c1", "function": {"name": "a", "arguments": ""}}]),
        _delta(tool_calls=[{"function": {"arguments": '{"x":1}'}}]),
        _delta(tool_calls=[{"id": "c2", "function": {"name": "b", "arguments": '{"y":2}'}}]),
    ]
    starts = [e["content_block"] for e in _messages_stream(stream) if e["type"] == "content_block_start"]
    assert [(b["id"], b["name"]) for b in starts] == [("c1", "a"), ("c2", "b")]
    done = _responses_stream(stream)[-1]["response"]
    assert [(i["call_id"], i["name"], i["arguments"]) for i in done["output"]] == [
        ("c1", "a", '{"x":1}'),
        ("c2", "b", '{"y":2}'),
    ]


def test_text_after_a_tool_call_is_an_item_of_its_own_and_the_final_output_is_what_was_streamed() -> None:
    events = _responses_stream(
        [
            _delta(content="Hello"),
            _delta(tool_calls=[{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{}"}}]),
            _delta(content=" after"),
        ]
    )
    added = [
        (e["output_index"], e["item"]["id"]) for e in events if e["type"] == "response.output_item.added"
    ]
    assert added == [(0, "msg_sy7_0"), (1, "fc_sy7_1"), (2, "msg_sy7_2")]
    texts = [e["text"] for e in events if e["type"] == "response.output_text.done"]
    assert texts == ["Hello", " after"]
    final = events[-1]["response"]
    assert [i["id"] for i in final["output"]] == ["msg_sy7_0", "fc_sy7_1", "msg_sy7_2"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_an_empty_answer_announces_the_message_it_completes() -> None:
    events = _responses_stream([{"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}])
    assert [e["type"] for e in events][2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_stream_that_broke_upstream_ends_as_a_failure_not_a_finish() -> None:
    messages = _messages_stream([_delta(content="Hal")], broken=True)
    assert messages[-1]["type"] == "error" and messages[-1]["error"]["type"] == "api_error"
    assert "message_stop" not in [e["type"] for e in messages]
    responses = _responses_stream([_delta(content="Hal")], broken=True)
    assert responses[-1]["type"] == "response.failed"
    assert responses[-1]["response"]["status"] == "failed"
    assert responses[-1]["response"]["error"]["code"] == "server_error"
