"""OpenAI-style request bodies, checked in one place: what the gateway and serve_model accept.

Pure Python (no Django): the gateway (`inference.gateway`), the local model server
(`inference.local_serving`) and batch lines (`inference.batch`) all parse with it, so input that
no provider can take is refused with a 400 naming the field before any provider is called,
instead of reaching a provider that crashes on it (a dropped connection looks like a dead
deployment to the router and counts against its circuit breaker).

- The body is UTF-8 JSON (strict: no NaN or Infinity), an object, nested at most MAX_DEPTH deep
  with at most MAX_VALUES values.
- Every string in it, keys included, is valid Unicode: JSON's \\u escapes can spell a lone
  surrogate ("hi \\ud800") that UTF-8 cannot encode, so it is refused wherever it is.
- The fields we use have their JSON types (a boolean is not a number), ranges and lengths.
  Fields we do not use are ignored, as before, once the whole body passed the checks above.

Errors are `InvalidRequest` (status 400 unless said otherwise) with the field in `param`
(`messages[0].content`) and a code `invalid_<field>`; `error_document` is the OpenAI-style body.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from inference.adapters.base import ChatMessage, ChatRequest, CompletionRequest, InferenceInput

MAX_DEPTH = 32  # a chat body needs 5 (body, messages, message, content parts, part)
MAX_VALUES = 100_000  # bounds the walk below (a few tens of ms) whatever the body size allows
MAX_STOP = 4
MAX_TOKENS_LIMIT = 1_048_576  # above any model's output today; keeps budget estimates finite
MODEL_MAX_LENGTH = 256
USER_MAX_LENGTH = 256
INT64 = (-(2**63), 2**63 - 1)
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
# C0 and C1 control characters and DEL: a slug never holds one, and PostgreSQL refuses NUL.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class InvalidRequest(ValueError):
    """A request no provider can take: answered with `status` and an OpenAI-style body."""

    def __init__(
        self, message: str, *, param: str | None = None, code: str = "invalid_request", status: int = 400
    ) -> None:
        super().__init__(message)
        self.param = param
        self.code = code
        self.status = status


def error_document(
    message: str, *, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error body: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


@dataclass(frozen=True)
class ParsedRequest:
    model: str | None
    request: InferenceInput
    stream: bool = False
    include_usage: bool = False
    seed: int | None = None


# --- The body --------------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def json_document(raw: bytes | str) -> dict[str, Any]:
    """The body as a JSON object whose every string is valid Unicode (see the module docstring)."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        doc = json.loads(text, parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise InvalidRequest("The request body is not UTF-8 text", code="invalid_body") from None
    except ValueError:
        raise InvalidRequest("The request body is not valid JSON", code="invalid_body") from None
    except RecursionError:
        raise InvalidRequest(
            f"The request body is nested more than {MAX_DEPTH} levels deep", code="invalid_body"
        ) from None
    if not isinstance(doc, dict):
        raise InvalidRequest("The request body must be a JSON object", code="invalid_body")
    document_check(doc)
    return doc


def _segment(key: str) -> str:
    # A key may itself be the bad string: show it escaped, never as a lone surrogate again.
    return key.encode("utf-8", "backslashreplace").decode("utf-8")[:64]


def _param(path: tuple[str | int, ...]) -> str | None:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{_segment(part)}" if out else _segment(part))
    return out[:200] or None


def _unicode_ok(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def document_check(doc: Any) -> None:
    """Depth, count, finite numbers and valid Unicode over a parsed JSON value (iteratively)."""
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(doc, 1, ())]
    seen = 0
    while stack:
        value, depth, path = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            raise InvalidRequest(f"The request body holds more than {MAX_VALUES} values", code="invalid_body")
        if isinstance(value, str):
            if not _unicode_ok(value):
                where = _param(path)
                raise InvalidRequest(
                    f"{where or 'A string'} is not valid Unicode (a lone surrogate such as \\ud800)",
                    param=where,
                    code="invalid_unicode",
                )
        elif isinstance(value, float):
            if not math.isfinite(value):
                where = _param(path)
                raise InvalidRequest(f"{where} is out of range", param=where, code="invalid_number")
        elif isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                raise InvalidRequest(
                    f"The request body is nested more than {MAX_DEPTH} levels deep",
                    param=_param(path),
                    code="invalid_body",
                )
            if isinstance(value, dict):
                for key, item in value.items():
                    if not _unicode_ok(key):
                        where = _param((*path, key))
                        raise InvalidRequest(
                            f"The key {where} is not valid Unicode (a lone surrogate such as \\ud800)",
                            param=where,
                            code="invalid_unicode",
                        )
                    stack.append((item, depth + 1, (*path, key)))
            else:
                stack.extend((item, depth + 1, (*path, i)) for i, item in enumerate(value))


# --- Fields ----------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer(doc: dict[str, Any], name: str, low: int, high: int, *, code: str | None = None) -> int | None:
    value = doc.get(name)
    if value is None:
        return None
    if not _is_int(value) or not low <= value <= high:
        raise InvalidRequest(
            f"{name} must be an integer from {low} to {high}", param=name, code=code or f"invalid_{name}"
        )
    return int(value)


def _number(doc: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = doc.get(name)
    if value is None:
        return None
    if not _is_number(value) or not low <= value <= high:
        raise InvalidRequest(
            f"{name} must be a number between {low:g} and {high:g}", param=name, code=f"invalid_{name}"
        )
    return float(value)


def _model(doc: dict[str, Any], *, required: bool) -> str | None:
    model = doc.get("model")
    if model is None and not required:
        return None
    if not isinstance(model, str) or not model:
        raise InvalidRequest(
            "model is required: the slug of a Switchyard workflow", param="model", code="invalid_model"
        )
    if len(model) > MODEL_MAX_LENGTH or _CONTROL.search(model):
        raise InvalidRequest(
            f"model must be at most {MODEL_MAX_LENGTH} characters without control characters",
            param="model",
            code="invalid_model",
        )
    return model


def _stop(doc: dict[str, Any]) -> tuple[str, ...]:
    stop = doc.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOP or not all(isinstance(s, str) for s in stops):
        raise InvalidRequest(
            f"stop must be a string or a list of at most {MAX_STOP} strings",
            param="stop",
            code="invalid_stop",
        )
    return tuple(stops)


def _options(doc: dict[str, Any]) -> dict[str, Any]:
    """The sampling options every request type shares, and the checks of the other common fields."""
    max_tokens = None
    for name in ("max_tokens", "max_completion_tokens"):
        given = _integer(doc, name, 1, MAX_TOKENS_LIMIT, code="invalid_max_tokens")
        max_tokens = given if given is not None else max_tokens
    n = doc.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise InvalidRequest("only n=1 is supported", param="n", code="invalid_n")
    for name in ("presence_penalty", "frequency_penalty"):
        _number(doc, name, -2.0, 2.0)
    _integer(doc, "seed", *INT64)
    user = doc.get("user")
    if user is not None and (not isinstance(user, str) or len(user) > USER_MAX_LENGTH):
        raise InvalidRequest(
            f"user must be a string of at most {USER_MAX_LENGTH} characters",
            param="user",
            code="invalid_user",
        )
    return {
        "max_tokens": max_tokens,
        "temperature": _number(doc, "temperature", 0.0, 2.0),
        "top_p": _number(doc, "top_p", 0.0, 1.0),
        "stop": _stop(doc),
    }


def _stream(doc: dict[str, Any]) -> tuple[bool, bool]:
    stream = doc.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest("stream must be true or false", param="stream", code="invalid_stream")
    options = doc.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest(
            "stream_options must be an object", param="stream_options", code="invalid_stream_options"
        )
    include_usage = (options or {}).get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise InvalidRequest(
            "stream_options.include_usage must be true or false",
            param="stream_options.include_usage",
            code="invalid_stream_options",
        )
    return bool(stream), bool(include_usage)


def _content(message: dict[str, Any], role: str, where: str) -> str:
    value = message.get("content")
    if isinstance(value, str):
        return value
    if value is None and role == "assistant":
        return ""  # an assistant turn that only called tools
    if isinstance(value, list):
        parts = []
        for i, part in enumerate(value):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise InvalidRequest(
                    f"{where}.content[{i}] must be a text part {{'type': 'text', 'text': '...'}}",
                    param=f"{where}.content[{i}]",
                    code="invalid_messages",
                )
            parts.append(part["text"])
        return "".join(parts)
    raise InvalidRequest(
        f"{where}.content must be a string or a list of text parts",
        param=f"{where}.content",
        code="invalid_messages",
    )


def _messages(doc: dict[str, Any]) -> tuple[ChatMessage, ...]:
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages must be a non-empty list", param="messages", code="invalid_messages")
    parsed = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise InvalidRequest(
                f"{where} must be an object with a role and content", param=where, code="invalid_messages"
            )
        role = m.get("role")
        if role not in ROLES:
            raise InvalidRequest(
                f"{where}.role must be one of {', '.join(ROLES)}",
                param=f"{where}.role",
                code="invalid_messages",
            )
        parsed.append(ChatMessage(role=role, content=_content(m, role, where)))
    return tuple(parsed)


def _prompt(doc: dict[str, Any]) -> str:
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise InvalidRequest(
            "prompt must be a string (or a list of one string)", param="prompt", code="invalid_prompt"
        )
    return prompt


def chat_request_parse(doc: dict[str, Any], *, require_model: bool = True) -> ParsedRequest:
    """A /chat/completions body (already through json_document) as a ChatRequest and its flags."""
    model = _model(doc, required=require_model)
    request = ChatRequest(messages=_messages(doc), **_options(doc))
    stream, include_usage = _stream(doc)
    return ParsedRequest(model, request, stream, include_usage, doc.get("seed"))


def completion_request_parse(doc: dict[str, Any], *, require_model: bool = True) -> ParsedRequest:
    """A /completions body (already through json_document) as a CompletionRequest and its flags."""
    model = _model(doc, required=require_model)
    request = CompletionRequest(prompt=_prompt(doc), **_options(doc))
    stream, include_usage = _stream(doc)
    return ParsedRequest(model, request, stream, include_usage, doc.get("seed"))
