"""Anthropic's Messages API (`POST /v1/messages`) as a parse/respond pair on the chat pipeline.

The gateway's pipeline speaks OpenAI's chat format: routing, limits, budgets, the ledger and every
adapter (OpenAI-compatible providers as they are, Bedrock through Converse) take a ChatRequest and
give back an OpenAI chat document. So a Messages body is translated here into the chat document
it means and parsed by `chat_request_parse` (the same checks as /v1/chat/completions), and the
chat answer (plain or streamed) is translated back into a Messages answer. Nothing is dropped in
silence: a field or block that has no chat equivalent is a 400 naming it (`messages[2].content[0]`,
`top_k`), as Anthropic's own API answers a field it does not know.

Written from Anthropic's published API reference (Messages, streaming events, errors); the
support table in inference/README.md lists each field as passed, translated or refused.

A deployment of an Anthropic-format provider (inference.adapters.anthropic) is sent the body as
the caller wrote it (`ChatRequest.anthropic_wire`, less model and stream), once it has passed
these checks; only its answer comes back through chat. For every other provider:

What does not carry over and how it is handled:
- `cache_control` on system, tools and content blocks is accepted and not sent on: it asks
  Anthropic to write a prompt cache, and OpenAI-compatible providers cache prompts by themselves
  (their cached tokens come back as `cache_read_input_tokens`, billed at the cached-input price).
  A provider that reports cache writes (`prompt_tokens_details.cache_write_tokens`) has them
  given back as `cache_creation_input_tokens`; they are billed at the cache-write price
  (`cache_write_tokens_1m`) where the price book has one, else as input tokens.
- `stop_reason` "stop_sequence" cannot be told from "end_turn": a chat answer does not say which
  stop sequence ended it, so both are "end_turn" and `stop_sequence` is null.
- `tool_result` blocks become `tool` messages (a chat tool message holds text only, so an image
  in a tool result is refused); `is_error: true` is carried as the text prefix "Error: ".
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from inference.adapters.base import ChatRequest
from inference.gateway.openai_body import (
    MAX_TOKENS_LIMIT,
    USER_MAX_LENGTH,
    field_error,
    is_int,
    string_field,
)
from inference.gateway.openai_request import ParsedRequest
from inference.gateway.translated.common import chat_parse_translated, invalid, text_content

API_VERSION = "2023-06-01"  # the only version of the Messages API there is, and the SDK's default

# Top-level fields of a Messages body, and those refused because a chat route cannot carry them.
_FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "stop_sequences",
        "temperature",
        "top_p",
        "metadata",
        "stream",
        "output_config",
        "cache_control",
    }
)
_REFUSED = {
    "top_k": "has no equivalent in the chat format this workflow's deployments speak",
    "thinking": "extended thinking cannot be carried to this workflow's deployments",
    "container": "containers are Anthropic's own tool runtime",
    "mcp_servers": "MCP servers are run by Anthropic's own API",
    "service_tier": "is a setting of Anthropic's own capacity",
    "context_management": "is a setting of Anthropic's own API",
    "diagnostics": "reports on Anthropic's own prompt cache",
    "inference_geo": "cannot be honoured: where the answer is computed is the workflow's deployments' choice",
    "user_profile_id": "is an Anthropic account setting",
    "workspace_id": "is an Anthropic account setting",
}
# Keys of a custom tool: cache_control and eager_input_streaming are accepted and have no effect.
_TOOL_KEYS = frozenset(
    {"type", "name", "description", "input_schema", "strict", "cache_control", "eager_input_streaming"}
)
# The chat fields the translation writes → the Messages field a chat-side error is about.
_PARAMS = {
    "stop": "stop_sequences",
    "user": "metadata.user_id",
    "parallel_tool_calls": "tool_choice",
    "reasoning_effort": "output_config.effort",
    "response_format": "output_config.format",
}


def _text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise invalid(f"{where}.text", "must be a string")
    return text


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    """An image block as a chat image part: base64 data as a data: URL, a url as itself."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise invalid(f"{where}.source", "must be an object with a type")
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if media not in ("image/jpeg", "image/png", "image/gif", "image/webp"):
            raise invalid(
                f"{where}.source.media_type", "must be image/jpeg, image/png, image/gif or image/webp"
            )
        if not isinstance(data, str) or not data:
            raise invalid(f"{where}.source.data", "must be the image's base64 data")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if kind == "url":
        url = source.get("url")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise invalid(f"{where}.source.url", "must be an http(s) URL")
        return {"type": "image_url", "image_url": {"url": url}}
    raise invalid(f"{where}.source.type", "must be base64 or url")


def _blocks(value: Any, where: str) -> list[dict[str, Any]]:
    """A message's content as a list of blocks (a string is one text block)."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if not isinstance(value, list):
        raise invalid(where, "must be a string or a list of content blocks")
    for i, block in enumerate(value):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise invalid(f"{where}[{i}]", "must be a content block {'type': ..., ...}")
    return value


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A tool_result block as the chat `tool` message that answers the call."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"{where}.tool_use_id", "must be the id of the tool_use block this answers")
    texts = []
    content = block.get("content", "")
    for i, part in enumerate(_blocks(content, f"{where}.content")):
        if part["type"] != "text":
            raise invalid(f"{where}.content[{i}]", "cannot be carried: a chat tool result holds text only")
        texts.append(_text(part, f"{where}.content[{i}]"))
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise invalid(f"{where}.is_error", "must be true or false")
    if is_error:
        texts = [f"Error: {texts[0] if texts else ''}", *texts[1:]]
    return {"role": "tool", "tool_call_id": call_id, "content": text_content(texts or [""])}


def _user_messages(content: Any, where: str) -> list[dict[str, Any]]:
    """A user turn: its tool results as `tool` messages first (a chat tool message must follow
    the assistant's calls), then the rest as one user message."""
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(_blocks(content, f"{where}.content")):
        at = f"{where}.content[{i}]"
        kind = block["type"]
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, at)})
        elif kind == "image":
            parts.append(_image_part(block, at))
        elif kind == "tool_result":
            tools.append(_tool_result(block, at))
        else:
            raise invalid(f"{at}.type", f"{kind!r} cannot be carried to this workflow's deployments")
    messages = list(tools)
    if parts:
        if all(p["type"] == "text" for p in parts):
            messages.append({"role": "user", "content": text_content([p["text"] for p in parts])})
        else:
            messages.append({"role": "user", "content": parts})
    if not messages:
        raise invalid(f"{where}.content", "must not be empty")
    return messages


def _assistant_message(content: Any, where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(_blocks(content, f"{where}.content")):
        at = f"{where}.content[{i}]"
        kind = block["type"]
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "tool_use":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
            if not isinstance(call_id, str) or not call_id:
                raise invalid(f"{at}.id", "must be a string")
            if not isinstance(name, str) or not name:
                raise invalid(f"{at}.name", "must be a string")
            if not isinstance(arguments, dict):
                raise invalid(f"{at}.input", "must be an object")
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            )
        else:
            raise invalid(f"{at}.type", f"{kind!r} cannot be carried to this workflow's deployments")
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text_content(texts) if texts else ("" if not calls else None),
    }
    if calls:
        message["tool_calls"] = calls
    return message


def _messages(doc: dict[str, Any]) -> list[dict[str, Any]]:
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "must be a non-empty list")
    chat: list[dict[str, Any]] = []
    system = doc.get("system")
    if system is not None:
        blocks = _blocks(system, "system")
        for i, block in enumerate(blocks):
            if block["type"] != "text":
                raise invalid(f"system[{i}].type", "must be text")
        texts = [_text(b, f"system[{i}]") for i, b in enumerate(blocks)]
        if texts:
            chat.append({"role": "system", "content": text_content(texts)})
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or "content" not in m:
            raise invalid(where, "must be an object with a role and content")
        role = m.get("role")
        if role == "user":
            chat.extend(_user_messages(m["content"], where))
        elif role == "assistant":
            chat.append(_assistant_message(m["content"], where))
        else:
            raise invalid(f"{where}.role", "must be user or assistant")
    if messages[-1].get("role") == "assistant":
        raise invalid(
            f"messages[{len(messages) - 1}].role",
            "is a final assistant turn (a prefill), which cannot be carried: a chat model answers "
            "after it instead of continuing it",
        )
    return chat


def _tools(doc: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = doc.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise invalid("tools", "must be a list of tools")
    chat = []
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid(at, "must be an object")
        if tool.get("type") not in (None, "custom"):
            raise invalid(
                f"{at}.type", f"{tool['type']!r} is a tool Anthropic runs; only custom tools can be routed"
            )
        for key in tool:
            if key not in _TOOL_KEYS:
                raise invalid(f"{at}.{key}", "cannot be carried to this workflow's deployments")
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise invalid(f"{at}.name", "must be a string")
        if not isinstance(schema, dict):
            raise invalid(f"{at}.input_schema", "must be a JSON schema object")
        function: dict[str, Any] = {"name": name, "parameters": schema}
        description = tool.get("description")
        if description is not None:
            string_field(description, f"{at}.description")
            function["description"] = description
        strict = tool.get("strict")
        if strict is not None:
            if not isinstance(strict, bool):
                raise invalid(f"{at}.strict", "must be true or false")
            function["strict"] = strict
        chat.append({"type": "function", "function": function})
    return chat


def _tool_choice(doc: dict[str, Any], chat: dict[str, Any]) -> None:
    choice = doc.get("tool_choice")
    if choice is None:
        return
    if not isinstance(choice, dict):
        raise invalid("tool_choice", "must be an object with a type")
    kind = choice.get("type")
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise invalid("tool_choice.name", "must name a tool")
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise invalid("tool_choice.type", "must be auto, any, tool or none")
    no_parallel = choice.get("disable_parallel_tool_use")
    if no_parallel is not None:
        if not isinstance(no_parallel, bool):
            raise invalid("tool_choice.disable_parallel_tool_use", "must be true or false")
        if no_parallel and kind != "none":
            chat["parallel_tool_calls"] = False


def _output_config(doc: dict[str, Any], chat: dict[str, Any]) -> None:
    """output_config: `effort` as the chat reasoning_effort, `format` (a JSON schema the answer
    must follow) as a json_schema response_format."""
    config = doc.get("output_config")
    if config is None:
        return
    if not isinstance(config, dict):
        raise invalid("output_config", "must be an object")
    for key, value in config.items():
        if value is None:
            continue
        if key == "effort":
            if value not in ("low", "medium", "high", "xhigh", "max"):
                raise invalid("output_config.effort", "must be low, medium, high, xhigh or max")
            chat["reasoning_effort"] = value
        elif key == "format":
            if not isinstance(value, dict) or value.get("type") != "json_schema":
                raise invalid("output_config.format.type", "must be json_schema")
            if not isinstance(value.get("schema"), dict):
                raise invalid("output_config.format.schema", "must be a JSON schema object")
            chat["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": value["schema"], "strict": True},
            }
        else:
            raise invalid(f"output_config.{key}", "is not a field of output_config")


def messages_to_chat(doc: dict[str, Any], *, counting: bool = False) -> dict[str, Any]:
    """The chat document a Messages body means (see the module docstring). `counting`: a
    count_tokens body, which has no max_tokens or stream."""
    for name in doc:
        if name in _REFUSED:
            raise invalid(name, _REFUSED[name])
        if name not in _FIELDS:
            raise invalid(name, "is not a field of the Messages API")
    chat: dict[str, Any] = {"model": doc.get("model"), "messages": _messages(doc)}
    max_tokens: Any = doc.get("max_tokens")
    if not counting or max_tokens is not None:  # count_tokens takes the field but needs none
        if not is_int(max_tokens) or not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
            raise invalid("max_tokens", f"must be an integer from 1 to {MAX_TOKENS_LIMIT}")
        if not counting:
            chat["max_tokens"] = max_tokens
    tools = _tools(doc)
    if tools is not None:
        chat["tools"] = tools
    _tool_choice(doc, chat)
    stops = doc.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise invalid("stop_sequences", "must be a list of non-empty strings")
        if stops:
            chat["stop"] = stops
    for name in ("temperature", "top_p"):
        if name in doc:
            value = doc[name]
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
                raise invalid(name, "must be a number from 0 to 1")
            chat[name] = value
    metadata = doc.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise invalid("metadata", "must be an object")
        for key in metadata:
            if key != "user_id":
                raise invalid(f"metadata.{key}", "is not a metadata field (only user_id is)")
        user = metadata.get("user_id")
        if user is not None:
            string_field(user, "metadata.user_id", max_length=USER_MAX_LENGTH)
            chat["user"] = user
    _output_config(doc, chat)
    stream = doc.get("stream")
    if stream is not None:
        if not isinstance(stream, bool):
            raise invalid("stream", "must be true or false")
        if stream and not counting:
            chat["stream"] = True
            chat["stream_options"] = {"include_usage": True}
    return chat


def messages_request_parse(doc: dict[str, Any], *, counting: bool = False) -> ParsedRequest:
    """A Messages body as the chat pipeline's request (checked as a chat body is, once translated;
    an error there names the Messages field it came from)."""
    if doc.get("model") is None:
        raise field_error("model", "is required: the workflow to call")
    chat = messages_to_chat(doc, counting=counting)
    parsed = chat_parse_translated(chat, renamed=_PARAMS, lists=("messages", "tools", "tool_choice"))
    if counting or not isinstance(parsed.request, ChatRequest):
        return parsed
    # Checked as its chat translation; an Anthropic-format provider gets the body as written.
    native = {k: v for k, v in doc.items() if k not in ("model", "stream")}
    return dataclasses.replace(parsed, request=dataclasses.replace(parsed.request, anthropic_wire=native))
