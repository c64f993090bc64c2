"""OpenAI-style request bodies, checked in one place: what the gateway and serve_model accept.

Pure Python (no Django): the gateway (`inference.gateway.views`), the local model server
(`inference.serving.local`) and batch lines (`inference.batch.jobs`) all parse with it, so input that
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

from dataclasses import dataclass
from typing import Any

from inference.adapters.base import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    InferenceInput,
)
from inference.gateway.openai_body import (
    MAX_N,
    ROLES,
    USER_MAX_LENGTH,
    InvalidRequest,
    boolean_field,
    field_error,
    integer_field,
    is_int,
    model_field,
    object_field,
    options_fields,
    param_segment,
    stream_fields,
    string_field,
)


@dataclass(frozen=True)
class ParsedRequest:
    model: str | None
    request: InferenceInput
    stream: bool = False
    include_usage: bool = False
    seed: int | None = None


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
            string_field(m.get(name), f"{where}.{name}")
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
        raise field_error("tools", "must be a list of tools")
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise field_error(at, "must be an object with a type", "invalid_tools")
        if tool["type"] == "function":
            function = tool.get("function")
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise field_error(f"{at}.function", "must be an object with a name", "invalid_tools")
            object_field(function.get("parameters"), f"{at}.function.parameters")
            if function.get("strict") is not None and not isinstance(function["strict"], bool):
                raise field_error(f"{at}.function.strict", "must be true or false", "invalid_tools")
    return tuple(tools)


def _tool_choice(doc: dict[str, Any]) -> str | dict[str, Any] | None:
    choice = doc.get("tool_choice")
    if choice is None or isinstance(choice, str):
        return choice
    if not isinstance(choice, dict) or not isinstance(choice.get("type"), str):
        raise field_error("tool_choice", "must be none, auto, required or an object naming a tool")
    return choice


def _response_format(doc: dict[str, Any]) -> dict[str, Any] | None:
    fmt = object_field(doc.get("response_format"), "response_format")
    if fmt is None:
        return None
    if not isinstance(fmt.get("type"), str):
        raise field_error(
            "response_format.type", "must be text, json_object or json_schema", "invalid_response_format"
        )
    if fmt["type"] == "json_schema":
        schema = fmt.get("json_schema")
        if not isinstance(schema, dict) or not isinstance(schema.get("name"), str):
            raise field_error(
                "response_format.json_schema", "must be an object with a name", "invalid_response_format"
            )
        object_field(schema.get("schema"), "response_format.json_schema.schema")
    return fmt


def _chat_fields(doc: dict[str, Any]) -> None:
    """Types of the chat fields Switchyard does not act on but knows (carried through as JSON)."""
    boolean_field(doc, "parallel_tool_calls")
    boolean_field(doc, "logprobs")
    integer_field(doc, "top_logprobs", 0, 20)
    metadata = object_field(doc.get("metadata"), "metadata") or {}
    for key, value in metadata.items():
        string_field(value, f"metadata.{param_segment(key)}", required=True, max_length=512)
    modalities = doc.get("modalities")
    if modalities is not None and (
        not isinstance(modalities, list) or not all(isinstance(m, str) for m in modalities)
    ):
        raise field_error("modalities", "must be a list of strings")
    boolean_field(doc, "store")
    for name in ("service_tier", "reasoning_effort"):
        string_field(doc.get(name), name, max_length=64)


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
    model = model_field(doc, required=require_model)
    _chat_fields(doc)
    request = ChatRequest(
        messages=_messages(doc),
        tools=_tools(doc),
        tool_choice=_tool_choice(doc),
        response_format=_response_format(doc),
        wire=_wire(doc),
        **options_fields(doc),
    )
    stream, include_usage = stream_fields(doc)
    return ParsedRequest(model, request, stream, include_usage, doc.get("seed"))


def completion_request_parse(doc: dict[str, Any], *, require_model: bool = True) -> ParsedRequest:
    """A /completions body (already through json_document) as a CompletionRequest and its flags."""
    model = model_field(doc, required=require_model)
    integer_field(doc, "logprobs", 0, 5)  # an integer here, a boolean in chat
    integer_field(doc, "best_of", 1, MAX_N)
    boolean_field(doc, "echo")
    string_field(doc.get("suffix"), "suffix")
    request = CompletionRequest(prompt=_prompt(doc), wire=_wire(doc), **options_fields(doc))
    stream, include_usage = stream_fields(doc)
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
    if all(is_int(v) and v >= 0 for v in value):
        return ()
    if all(isinstance(v, list) and v and all(is_int(t) and t >= 0 for t in v) for v in value):
        return ()
    raise InvalidRequest(message, param="input", code="invalid_input")


@dataclass(frozen=True)
class ParsedEmbedding:
    model: str | None
    request: EmbeddingRequest


def embedding_request_parse(doc: dict[str, Any], *, require_model: bool = True) -> ParsedEmbedding:
    """An /embeddings body (already through json_document) as an EmbeddingRequest."""
    model = model_field(doc, required=require_model)
    texts = _embedding_input(doc)
    encoding = doc.get("encoding_format")
    if encoding is not None and encoding not in ("float", "base64"):
        raise field_error("encoding_format", "must be float or base64")
    integer_field(doc, "dimensions", 1, 65_536)
    string_field(doc.get("user"), "user", max_length=USER_MAX_LENGTH)
    return ParsedEmbedding(model, EmbeddingRequest(texts=texts, wire=_wire(doc)))
