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
- The fields Switchyard acts on (model, messages and their roles, stream, max_tokens, n, tools,
  response_format, ...) have their JSON types (a boolean is not a number), ranges and lengths,
  and so do the documented fields it only carries (tool_choice, logprobs, metadata, ...). The
  body itself, less `model`, travels in the request (`wire`) and reaches OpenAI-compatible
  providers unchanged: fields Switchyard does not know are carried, never dropped.

Errors are `InvalidRequest` (status 400 unless said otherwise) with the field in `param`
(`messages[0].content`) and a code `invalid_<field>`; `error_document` is the OpenAI-style body.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from inference.adapters.base import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    InferenceInput,
)

MAX_DEPTH = 32  # a chat body needs 5 (body, messages, message, content parts, part)
MAX_VALUES = 100_000  # bounds the walk below (a few tens of ms) whatever the body size allows
MAX_STOP = 4
MAX_N = 128  # OpenAI's own limit on choices per request
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


def _bad(name: str, message: str, code: str | None = None) -> InvalidRequest:
    return InvalidRequest(
        f"{name} {message}", param=name, code=code or f"invalid_{name.split('.')[0].split('[')[0]}"
    )


def _boolean(doc: dict[str, Any], name: str) -> bool | None:
    value = doc.get(name)
    if value is not None and not isinstance(value, bool):
        raise _bad(name, "must be true or false")
    return value


def _object(value: Any, name: str, *, required: bool = False) -> dict[str, Any] | None:
    if value is None and not required:
        return None
    if not isinstance(value, dict):
        raise _bad(name, "must be an object")
    return value


def _string(value: Any, name: str, *, required: bool = False, max_length: int | None = None) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or (max_length is not None and len(value) > max_length):
        limit = f" of at most {max_length} characters" if max_length is not None else ""
        raise _bad(name, f"must be a string{limit}")
    return value


def _options(doc: dict[str, Any]) -> dict[str, Any]:
    """The sampling options every request type shares, and the checks of the other common fields."""
    max_tokens = None
    for name in ("max_tokens", "max_completion_tokens"):
        given = _integer(doc, name, 1, MAX_TOKENS_LIMIT, code="invalid_max_tokens")
        max_tokens = given if given is not None else max_tokens
    n = _integer(doc, "n", 1, MAX_N)
    for name in ("presence_penalty", "frequency_penalty"):
        _number(doc, name, -2.0, 2.0)
    _integer(doc, "seed", *INT64)
    _string(doc.get("user"), "user", max_length=USER_MAX_LENGTH)
    logit_bias = _object(doc.get("logit_bias"), "logit_bias") or {}
    for key, bias in logit_bias.items():
        if not _is_number(bias) or not -100 <= bias <= 100:
            raise _bad(
                f"logit_bias.{_segment(key)}", "must be a number from -100 to 100", "invalid_logit_bias"
            )
    return {
        "max_tokens": max_tokens,
        "temperature": _number(doc, "temperature", 0.0, 2.0),
        "top_p": _number(doc, "top_p", 0.0, 1.0),
        "stop": _stop(doc),
        "n": n or 1,
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


# Content parts whose inner object Switchyard checks; other part types pass through as written.
_PART_FIELDS = {"text": ("text", str), "refusal": ("refusal", str), "image_url": ("image_url", dict)}


def _content(message: dict[str, Any], role: str, where: str) -> tuple[str, tuple[dict[str, Any], ...]]:
    """The message's text (text parts joined) and its other content parts."""
    value = message.get("content")
    if isinstance(value, str):
        return value, ()
    if value is None and role in ("assistant", "function"):
        return "", ()  # an assistant turn that only called tools (or refused)
    if isinstance(value, list):
        texts: list[str] = []
        others: list[dict[str, Any]] = []
        for i, part in enumerate(value):
            at = f"{where}.content[{i}]"
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise InvalidRequest(
                    f"{at} must be a content part {{'type': ..., ...}}", param=at, code="invalid_messages"
                )
            kind = part["type"]
            if kind in _PART_FIELDS:
                key, expected = _PART_FIELDS[kind]
                if not isinstance(part.get(key), expected):
                    raise InvalidRequest(
                        f"{at}.{key} must be {'a string' if expected is str else 'an object'}",
                        param=f"{at}.{key}",
                        code="invalid_messages",
                    )
                if kind == "image_url" and not isinstance(part[key].get("url"), str):
                    raise InvalidRequest(
                        f"{at}.image_url.url must be a string",
                        param=f"{at}.image_url.url",
                        code="invalid_messages",
                    )
            if kind == "text":
                texts.append(part["text"])
            else:
                others.append(part)
        return "".join(texts), tuple(others)
    raise InvalidRequest(
        f"{where}.content must be a string or a list of content parts",
        param=f"{where}.content",
        code="invalid_messages",
    )


def _tool_calls(message: dict[str, Any], where: str) -> tuple[dict[str, Any], ...]:
    calls = message.get("tool_calls")
    if calls is None:
        return ()
    if not isinstance(calls, list):
        raise InvalidRequest(
            f"{where}.tool_calls must be a list", param=f"{where}.tool_calls", code="invalid_messages"
        )
    for i, call in enumerate(calls):
        at = f"{where}.tool_calls[{i}]"
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(call, dict)
            or not isinstance(call.get("id"), str)
            or not isinstance(call.get("type"), str)
            or (call["type"] == "function" and not isinstance(function, dict))
            or (
                isinstance(function, dict)
                and (
                    not isinstance(function.get("name"), str)
                    or not isinstance(function.get("arguments"), str)
                )
            )
        ):
            raise InvalidRequest(
                f"{at} must be {{'id': str, 'type': 'function', 'function': {{'name': str, 'arguments': str}}}}",
                param=at,
                code="invalid_messages",
            )
    return tuple(calls)


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
        text, parts = _content(m, role, where)
        tool_call_id = m.get("tool_call_id")
        if role == "tool" and not isinstance(tool_call_id, str):
            raise InvalidRequest(
                f"{where}.tool_call_id must be the id of the tool call this message answers",
                param=f"{where}.tool_call_id",
                code="invalid_messages",
            )
        for name in ("name", "refusal"):
            _string(m.get(name), f"{where}.{name}")
        parsed.append(
            ChatMessage(
                role=role,
                content=text,
                tool_calls=_tool_calls(m, where) if role == "assistant" else (),
                tool_call_id=tool_call_id if role == "tool" else None,
                parts=parts,
            )
        )
    return tuple(parsed)


def _tools(doc: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    tools = doc.get("tools")
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise _bad("tools", "must be a list of tools")
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise _bad(at, "must be an object with a type", "invalid_tools")
        if tool["type"] == "function":
            function = tool.get("function")
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise _bad(f"{at}.function", "must be an object with a name", "invalid_tools")
            _object(function.get("parameters"), f"{at}.function.parameters")
            if function.get("strict") is not None and not isinstance(function["strict"], bool):
                raise _bad(f"{at}.function.strict", "must be true or false", "invalid_tools")
    return tuple(tools)


def _tool_choice(doc: dict[str, Any]) -> str | dict[str, Any] | None:
    choice = doc.get("tool_choice")
    if choice is None or isinstance(choice, str):
        return choice
    if not isinstance(choice, dict) or not isinstance(choice.get("type"), str):
        raise _bad("tool_choice", "must be none, auto, required or an object naming a tool")
    return choice


def _response_format(doc: dict[str, Any]) -> dict[str, Any] | None:
    fmt = _object(doc.get("response_format"), "response_format")
    if fmt is None:
        return None
    if not isinstance(fmt.get("type"), str):
        raise _bad(
            "response_format.type", "must be text, json_object or json_schema", "invalid_response_format"
        )
    if fmt["type"] == "json_schema":
        schema = fmt.get("json_schema")
        if not isinstance(schema, dict) or not isinstance(schema.get("name"), str):
            raise _bad(
                "response_format.json_schema", "must be an object with a name", "invalid_response_format"
            )
        _object(schema.get("schema"), "response_format.json_schema.schema")
    return fmt


def _chat_fields(doc: dict[str, Any]) -> None:
    """Types of the chat fields Switchyard does not act on but knows (carried through as JSON)."""
    _boolean(doc, "parallel_tool_calls")
    _boolean(doc, "logprobs")
    _integer(doc, "top_logprobs", 0, 20)
    metadata = _object(doc.get("metadata"), "metadata") or {}
    for key, value in metadata.items():
        _string(value, f"metadata.{_segment(key)}", required=True, max_length=512)
    modalities = doc.get("modalities")
    if modalities is not None and (
        not isinstance(modalities, list) or not all(isinstance(m, str) for m in modalities)
    ):
        raise _bad("modalities", "must be a list of strings")
    _boolean(doc, "store")
    for name in ("service_tier", "reasoning_effort"):
        _string(doc.get(name), name, max_length=64)


def _wire(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "model"}


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
    _chat_fields(doc)
    request = ChatRequest(
        messages=_messages(doc),
        tools=_tools(doc),
        tool_choice=_tool_choice(doc),
        response_format=_response_format(doc),
        wire=_wire(doc),
        **_options(doc),
    )
    stream, include_usage = _stream(doc)
    return ParsedRequest(model, request, stream, include_usage, doc.get("seed"))


def completion_request_parse(doc: dict[str, Any], *, require_model: bool = True) -> ParsedRequest:
    """A /completions body (already through json_document) as a CompletionRequest and its flags."""
    model = _model(doc, required=require_model)
    _integer(doc, "logprobs", 0, 5)  # an integer here, a boolean in chat
    _integer(doc, "best_of", 1, MAX_N)
    _boolean(doc, "echo")
    _string(doc.get("suffix"), "suffix")
    request = CompletionRequest(prompt=_prompt(doc), wire=_wire(doc), **_options(doc))
    stream, include_usage = _stream(doc)
    return ParsedRequest(model, request, stream, include_usage, doc.get("seed"))


MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit on inputs per embeddings request


def _embedding_input(doc: dict[str, Any]) -> tuple[str, ...]:
    """The texts of `input`: a string, a list of strings, a list of token ids or a list of lists
    of token ids (token ids are carried to the provider; they have no text here)."""
    value = doc.get("input")
    message = "input must be a non-empty string, list of strings or list of token-id lists"
    if isinstance(value, str) and value:
        return (value,)
    if not isinstance(value, list) or not value or len(value) > MAX_EMBEDDING_INPUTS:
        raise InvalidRequest(
            f"{message} (at most {MAX_EMBEDDING_INPUTS})", param="input", code="invalid_input"
        )
    if all(isinstance(v, str) and v for v in value):
        return tuple(value)
    if all(_is_int(v) and v >= 0 for v in value):
        return ()
    if all(isinstance(v, list) and v and all(_is_int(t) and t >= 0 for t in v) for v in value):
        return ()
    raise InvalidRequest(message, param="input", code="invalid_input")


@dataclass(frozen=True)
class ParsedEmbedding:
    model: str | None
    request: EmbeddingRequest


def embedding_request_parse(doc: dict[str, Any], *, require_model: bool = True) -> ParsedEmbedding:
    """An /embeddings body (already through json_document) as an EmbeddingRequest."""
    model = _model(doc, required=require_model)
    texts = _embedding_input(doc)
    encoding = doc.get("encoding_format")
    if encoding is not None and encoding not in ("float", "base64"):
        raise _bad("encoding_format", "must be float or base64")
    _integer(doc, "dimensions", 1, 65_536)
    _string(doc.get("user"), "user", max_length=USER_MAX_LENGTH)
    return ParsedEmbedding(model, EmbeddingRequest(texts=texts, wire=_wire(doc)))
