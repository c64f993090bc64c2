"""What the translators share: their 400 for a field of their own API, and the chat parse of a
translated body whose errors are renamed to the field of the caller's API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inference.gateway.openai_body import InvalidRequest
from inference.gateway.openai_request import ParsedRequest, chat_request_parse


def invalid(where: str, message: str) -> InvalidRequest:
    """A 400 naming `where`, a field of the caller's API (`messages[2].content[0]`)."""
    return InvalidRequest(f"{where} {message}", param=where, code="invalid_request")


def chat_parse_translated(
    chat: dict[str, Any], *, renamed: Mapping[str, str], lists: tuple[str, ...]
) -> ParsedRequest:
    """`chat_request_parse` of a translated body. Its errors name chat fields: `renamed` maps a
    chat field to the caller's; inside `lists` (chat lists whose indexes differ from the
    caller's after translation) the error names the whole list."""
    try:
        return chat_request_parse(chat)
    except InvalidRequest as exc:
        param = exc.param or ""
        head = param.split(".")[0].split("[")[0]
        param = head if head in lists else renamed.get(head, param)
        raise InvalidRequest(str(exc), param=param or None, code=exc.code, status=exc.status) from exc
