"""Anthropic Messages answers from the chat pipeline's: a chat answer as a Message, the chat
stream as Messages stream events, and errors in Anthropic's shape (the request side, and what
does not carry over, is inference.gateway.translated.messages_request)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from inference.gateway.translated.common import (
    answer_text,
    arguments_object,
    arguments_text,
    choice_deltas,
    new_tool_call,
)

# How the chat answer ended → Messages' stop_reason.
_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def _usage(usage: dict[str, Any] | None) -> dict[str, int]:
    """A chat usage object as Messages' (input_tokens excludes cache reads, as Anthropic's does)."""
    usage = usage or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0)
    written = int(details.get("cache_write_tokens") or 0)  # reported by some OpenAI-style providers
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    doc: dict[str, Any] = {
        "input_tokens": max(0, prompt - cached - written),
        "cache_creation_input_tokens": written,
        "cache_read_input_tokens": cached,
        "output_tokens": int(usage.get("completion_tokens") or 0),
    }
    if reasoning:
        doc["output_tokens_details"] = {"thinking_tokens": int(reasoning)}
    return doc


def message_id(request_id: int | None) -> str:
    return f"msg_sy{request_id}"


def chat_to_message(chat: dict[str, Any], *, request_id: int | None, model: str) -> dict[str, Any]:
    """A chat answer (choice 0: Messages has no `n`) as a Messages answer."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    text = answer_text(message.get("content")) or answer_text(message.get("refusal"))
    if text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = arguments_object(function.get("arguments"))
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                # Arguments that are not a JSON object are given as the provider wrote them.
                "input": arguments
                if arguments is not None
                else {"_arguments": arguments_text(function.get("arguments"))},
            }
        )
    finish = choice.get("finish_reason") or "stop"
    stop_reason = (
        "refusal"
        if message.get("refusal") and not message.get("content")
        else _STOP_REASONS.get(finish, "end_turn")
    )
    return {
        "id": message_id(request_id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": _usage(chat.get("usage")),
    }


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_body(status: int, chat_error: dict[str, Any]) -> dict[str, Any]:
    """An error as Anthropic's API writes it, from the gateway's OpenAI-style error document (its
    code and param kept beside, for a client that reads them)."""
    inner = chat_error.get("error") or {}
    error: dict[str, Any] = {
        "type": _ERROR_TYPES.get(status, "api_error"),
        "message": inner.get("message") or "error",
    }
    for key in ("code", "param"):
        if inner.get(key) is not None:
            error[key] = inner[key]
    return {"type": "error", "error": error}


def _event(name: str, doc: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: ".encode() + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class MessagesStream:
    """Chat stream events in, Messages stream events out: message_start, then for each text run or
    tool call a content block (start, deltas, stop), then message_delta (stop_reason and usage)
    and message_stop. Choice 0 only (Messages has no `n`)."""

    request_id: int | None
    model: str
    _block: int = -1  # the open content block's index (-1: none open)
    _open: str | None = None  # "text", or "tool:<tool-call id>" (common.new_tool_call)
    _finish: str = "stop"
    _refused: bool = False
    _usage: dict[str, Any] | None = None

    def start(self) -> Iterator[bytes]:
        message = chat_to_message(
            {"choices": [{"message": {}}]}, request_id=self.request_id, model=self.model
        )
        message["stop_reason"] = None
        yield _event("message_start", {"type": "message_start", "message": message})

    def _close(self) -> Iterator[bytes]:
        if self._open is not None:
            yield _event("content_block_stop", {"type": "content_block_stop", "index": self._block})
            self._open = None

    def _open_block(self, kind: str, block: dict[str, Any]) -> Iterator[bytes]:
        yield from self._close()
        self._block += 1
        self._open = kind
        yield _event(
            "content_block_start",
            {"type": "content_block_start", "index": self._block, "content_block": block},
        )

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event(
            "content_block_delta", {"type": "content_block_delta", "index": self._block, "delta": delta}
        )

    def feed(self, chunk: dict[str, Any]) -> Iterator[bytes]:
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for delta, finish in choice_deltas(chunk):
            text = answer_text(delta.get("content")) or answer_text(delta.get("refusal"))
            if delta.get("refusal"):
                self._refused = True
            if text:
                if self._open != "text":
                    yield from self._open_block("text", {"type": "text", "text": ""})
                yield self._delta({"type": "text_delta", "text": text})
            for call in delta.get("tool_calls") or []:
                kind = new_tool_call(call, self._open)
                function = call.get("function") or {}
                if kind is not None:
                    block = {
                        "type": "tool_use",
                        "id": call.get("id"),
                        "name": function.get("name"),
                        "input": {},
                    }
                    yield from self._open_block(kind, block)
                piece = arguments_text(function.get("arguments"))
                if piece:
                    yield self._delta({"type": "input_json_delta", "partial_json": piece})
            if finish:
                self._finish = finish

    def end(self, switchyard: dict[str, Any] | None, *, broken: bool) -> Iterator[bytes]:
        yield from self._close()
        if broken:
            # Anthropic's stream error event: the SDK raises it; no message_stop follows.
            error = {"type": "api_error", "message": "The provider's stream broke: the answer is incomplete"}
            yield _event("error", {"type": "error", "error": error, "switchyard": switchyard})
            return
        stop_reason = "refusal" if self._refused else _STOP_REASONS.get(self._finish, "end_turn")
        delta: dict[str, Any] = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": _usage(self._usage),
        }
        if switchyard is not None:
            delta["switchyard"] = switchyard
        yield _event("message_delta", delta)
        yield _event("message_stop", {"type": "message_stop"})
