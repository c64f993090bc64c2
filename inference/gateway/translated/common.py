"""What the translators share: their 400 for a field of their own API, text blocks as chat
content, and the chat parse of a translated body whose errors are renamed to the field of the
caller's API."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from inference.adapters.base import tool_arguments_object
from inference.gateway.openai_body import InvalidRequest
from inference.gateway.openai_request import ParsedRequest, chat_request_parse


def invalid(where: str, message: str) -> InvalidRequest:
    """A 400 naming `where`, a field of the caller's API (`messages[2].content[0]`)."""
    return InvalidRequest(f"{where} {message}", param=where, code="invalid_request")


def text_content(texts: list[str]) -> str | list[dict[str, Any]]:
    """A message's text blocks as chat content: one block as a string, several as text parts
    (kept apart, as the caller wrote them, not run together)."""
    if len(texts) == 1:
        return texts[0]
    return [{"type": "text", "text": t} for t in texts]


def answer_text(value: Any) -> str:
    """A chat answer's content (or refusal) as text: a string as it is, content parts' texts
    joined (some OpenAI-style providers answer in parts), nothing as ''."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(p["text"] for p in value if isinstance(p, dict) and isinstance(p.get("text"), str))
    return str(value)


def arguments_text(value: Any) -> str:
    """A tool call's arguments as the JSON text the chat format carries (some providers send an
    object instead of its text)."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def arguments_object(value: Any) -> dict[str, Any] | None:
    """A tool call's arguments as an object (None: text that is not a JSON object)."""
    return value if isinstance(value, dict) else tool_arguments_object(arguments_text(value))


def choice_deltas(chunk: dict[str, Any]) -> list[tuple[dict[str, Any], str | None]]:
    """A chat stream chunk's deltas of choice 0 with their finish reasons (the agents' APIs have
    no `n`: other choices are not asked for and not passed on)."""
    return [
        (choice.get("delta") or {}, choice.get("finish_reason"))
        for choice in chunk.get("choices") or []
        if choice.get("index", 0) == 0
    ]


def new_tool_call(call: dict[str, Any], open_kind: str | None) -> str | None:
    """The kind (`tool:<id>`) of the output block a streamed tool-call delta starts, or None
    when it continues the open one. A delta with an id the open block does not have starts a
    call (keyed by id, not by `index`, which some providers leave out or repeat); one without
    an id continues the open tool block."""
    call_id = call.get("id")
    if call_id:
        kind = f"tool:{call_id}"
        return None if open_kind == kind else kind
    if open_kind is not None and open_kind.startswith("tool:"):
        return None
    return "tool:"


def chat_parse_translated(
    chat: dict[str, Any], *, renamed: Mapping[str, str], lists: tuple[str, ...]
) -> ParsedRequest:
    """`chat_request_parse` of a translated body. Its errors name chat fields: `renamed` maps a
    chat field to the caller's; inside `lists` (chat lists whose indexes differ from the
    caller's after translation) the error names the whole list."""
    try:
        return chat_request_parse(chat)
    except InvalidRequest as exc:
        chat_param = exc.param or ""
        head = chat_param.split(".")[0].split("[")[0]
        param = head if head in lists else renamed.get(head, chat_param)
        message = str(exc)
        if head in renamed and chat_param and message.startswith(chat_param):
            message = param + message[len(chat_param) :]  # "stop must be ..." → "stop_sequences ..."
        raise InvalidRequest(message, param=param or None, code=exc.code, status=exc.status) from exc
