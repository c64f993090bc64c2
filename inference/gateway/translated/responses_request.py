"""OpenAI's Responses API (`POST /v1/responses`) as a parse/respond pair on the chat pipeline.

As with Anthropic's Messages (messages_request), a Responses body is translated
into the chat request it means and checked by `chat_request_parse`; the chat answer, plain or
streamed, is translated back into a Response object and the Responses stream events. Every
deployment of the workflow can answer (OpenAI-compatible providers get the chat body, Bedrock
gets it through Converse, Anthropic-format providers through Messages); a deployment that
serves `/responses` itself (Deployment.speaks_responses) gets the body as written, once it has
passed these checks (inference.adapters.responses_mapping). A field or item that a chat route
cannot carry is a 400 naming it, never a silent drop (a gateway that falls back from Responses
to chat and loses fields is the bug users report of other gateways).

Written from OpenAI's published API reference (Responses, its streaming events, the input item
types); the support table in docs/inference.md lists each field as passed, translated or refused.

`store` and `previous_response_id` are the live endpoint's (inference.gateway.stored: it takes
`previous_response_id` out of the body before this parser sees it and puts the conversation in
`input`); anywhere else, a batch line, `previous_response_id` is a 400 here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from inference.adapters.base import ChatRequest
from inference.gateway.openai_body import field_error
from inference.gateway.openai_request import ParsedRequest
from inference.gateway.translated.common import chat_parse_translated, invalid, text_content

# Fields carried to the chat body under the same name (their checks are the chat parser's).
_SAME = (
    "temperature",
    "top_p",
    "parallel_tool_calls",
    "metadata",
    "user",
    "service_tier",
    "prompt_cache_key",
)
# Fields handled here.
_HANDLED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "text",
        "reasoning",
        "max_output_tokens",
        "store",
        "previous_response_id",
        "stream",
        "stream_options",
        "safety_identifier",
        "truncation",
        "include",
        *_SAME,
    }
)
_REFUSED = {
    "background": "is not run here: every response is answered at once",
    "conversation": "(OpenAI's Conversations) is not kept here: use previous_response_id on a workflow that retains prompts",
    "prompt": "prompt templates live in OpenAI's dashboard",
    "max_tool_calls": "limits OpenAI's built-in tools, which a chat route does not run",
    "top_logprobs": "logprobs are not translated back into output_text items",
}


def _text_of(parts: Any, where: str, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    """A message's content as chat content parts: text parts (a refusal's text too) and
    input_image as image_url (an http(s) or data: URL; file ids need OpenAI's file store)."""
    if isinstance(parts, str):
        return [{"type": "text", "text": parts}]
    if not isinstance(parts, list):
        raise invalid(where, "must be a string or a list of content parts")
    chat: list[dict[str, Any]] = []
    for i, part in enumerate(parts):
        at = f"{where}[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            raise invalid(f"{at}.type", f"must be one of {', '.join(kinds)}")
        if kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str) or not url.startswith(("https://", "http://", "data:image/")):
                raise invalid(f"{at}.image_url", "must be an http(s) URL or a data:image/ URL")
            image: dict[str, Any] = {"url": url}
            detail = part.get("detail")
            if detail is not None:
                if detail not in ("low", "high", "auto"):
                    raise invalid(f"{at}.detail", "must be low, high or auto")
                image["detail"] = detail
            chat.append({"type": "image_url", "image_url": image})
            continue
        key = "refusal" if kind == "refusal" else "text"
        value = part.get(key)
        if not isinstance(value, str):
            raise invalid(f"{at}.{key}", "must be a string")
        chat.append({"type": "text", "text": value})
    return chat


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Chat content: text alone as a string (or text parts, kept apart), else the parts."""
    if all(p["type"] == "text" for p in parts):
        return text_content([p["text"] for p in parts] or [""])
    return parts


def _input(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """`instructions` and `input` as chat messages; function_call items join the assistant turn
    they belong to, function_call_output items become `tool` messages."""
    chat: list[dict[str, Any]] = []
    instructions = doc.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid("instructions", "must be a string")
        chat.append({"role": "system", "content": instructions})
    value = doc.get("input")
    if isinstance(value, str):
        return [*chat, {"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise invalid("input", "must be a string or a non-empty list of input items")
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(where, "must be an input item object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise invalid(f"{where}.role", "must be user, assistant, system or developer")
            kinds = ("output_text", "refusal") if role == "assistant" else ("input_text", "input_image")
            chat.append(
                {"role": role, "content": _content(_text_of(item.get("content"), f"{where}.content", kinds))}
            )
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
            for key, got in (("call_id", call_id), ("name", name), ("arguments", arguments)):
                if not isinstance(got, str):
                    raise invalid(f"{where}.{key}", "must be a string")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            last = chat[-1] if chat else None
            if last is not None and last["role"] == "assistant":  # the turn the call belongs to
                last.setdefault("tool_calls", []).append(call)
                if last.get("content") == "":
                    last["content"] = None
            else:
                chat.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise invalid(f"{where}.call_id", "must be the call_id of the function_call it answers")
            parts = _text_of(output, f"{where}.output", ("input_text",))
            chat.append({"role": "tool", "tool_call_id": call_id, "content": _content(parts)})
        else:
            raise invalid(f"{where}.type", f"{kind!r} cannot be carried to this workflow's deployments")
    return chat


def _tools(doc: dict[str, Any], chat: dict[str, Any]) -> None:
    _tool_choice(doc, chat)
    tools = doc.get("tools")
    if tools is None:
        return
    if not isinstance(tools, list):
        raise invalid("tools", "must be a list of tools")
    out = []
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise invalid(f"{at}.type", "must be function: built-in tools run on OpenAI's side only")
        function = {
            k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None
        }
        if tool.get("description") is not None and not isinstance(tool["description"], str):
            raise invalid(f"{at}.description", "must be a string")
        extra = set(tool) - {"type", "name", "description", "parameters", "strict"}
        if extra:
            raise invalid(f"{at}.{sorted(extra)[0]}", "cannot be carried to this workflow's deployments")
        out.append({"type": "function", "function": function})
    chat["tools"] = out


def _tool_choice(doc: dict[str, Any], chat: dict[str, Any]) -> None:
    choice = doc.get("tool_choice")
    if choice is None:
        return
    if choice in ("none", "auto", "required"):
        chat["tool_choice"] = choice
    elif (
        isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str)
    ):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise invalid("tool_choice", "must be none, auto, required or {'type': 'function', 'name': ...}")


def _text_format(doc: dict[str, Any], chat: dict[str, Any]) -> None:
    text = doc.get("text")
    if text is None:
        return
    if not isinstance(text, dict):
        raise invalid("text", "must be an object")
    for key in text:
        if key not in ("format", "verbosity"):
            raise invalid(f"text.{key}", "is not a field of text")
    if text.get("verbosity") is not None:
        if text["verbosity"] not in ("low", "medium", "high"):
            raise invalid("text.verbosity", "must be low, medium or high")
        chat["verbosity"] = text["verbosity"]
    fmt = text.get("format")
    if fmt is None:
        return
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return
    if kind == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if fmt.get(k) is not None}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    else:
        raise invalid("text.format.type", "must be text, json_object or json_schema")


def responses_to_chat(doc: dict[str, Any]) -> dict[str, Any]:
    """The chat document a Responses body means (see the module docstring)."""
    for name in doc:
        if name in _REFUSED:
            raise invalid(name, _REFUSED[name])
        if name not in _HANDLED:
            raise invalid(name, "cannot be carried to this workflow's deployments")
    if doc.get("previous_response_id") is not None:
        raise invalid(
            "previous_response_id",
            "cannot be used in a batch line: send the whole conversation in input",
        )
    store = doc.get("store")
    if store is not None and not isinstance(store, bool):
        raise invalid("store", "must be true or false")
    if doc.get("truncation") not in (None, "disabled"):
        raise invalid("truncation", "must be disabled: a chat route does not truncate the conversation")
    if doc.get("include"):
        raise invalid("include", "asks for output a chat route does not produce")
    chat: dict[str, Any] = {"model": doc.get("model"), "messages": _input(doc)}
    for name in _SAME:
        if doc.get(name) is not None:
            chat[name] = doc[name]
    for name in ("safety_identifier", "prompt_cache_key"):
        if doc.get(name) is not None and (not isinstance(doc[name], str) or len(doc[name]) > 256):
            raise invalid(name, "must be a string of at most 256 characters")
    if doc.get("safety_identifier") is not None and "user" not in chat:
        chat["user"] = doc["safety_identifier"]
    options = doc.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or any(k != "include_obfuscation" for k in options):
            raise invalid("stream_options", "may only hold include_obfuscation (which has no effect here)")
        if not isinstance(options.get("include_obfuscation", False), bool):
            raise invalid("stream_options.include_obfuscation", "must be true or false")
    if doc.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = doc["max_output_tokens"]
    _tools(doc, chat)
    _text_format(doc, chat)
    reasoning = doc.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise invalid("reasoning", "must be an object")
        for key, value in reasoning.items():
            if key == "effort":
                if value is not None:
                    chat["reasoning_effort"] = value
            elif value is not None:
                raise invalid(f"reasoning.{key}", "cannot be carried: a chat answer has no reasoning summary")
    if doc.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    elif doc.get("stream") not in (None, False):
        raise invalid("stream", "must be true or false")
    return chat


# Where a chat-side error points, in the Responses body's terms.
_PARAMS = {
    "max_completion_tokens": "max_output_tokens",
    "reasoning_effort": "reasoning.effort",
    "response_format": "text.format",
    "verbosity": "text.verbosity",
    "messages": "input",
}


def responses_request_parse(doc: dict[str, Any]) -> ParsedRequest:
    if doc.get("model") is None:
        raise field_error("model", "is required: the workflow to call")
    chat = responses_to_chat(doc)  # its errors name the Responses field already
    parsed = chat_parse_translated(chat, renamed=_PARAMS, lists=("tools", "tool_choice"))
    if not isinstance(parsed.request, ChatRequest):
        return parsed
    # Checked as its chat translation; a deployment that serves /responses gets it as written.
    native = {k: v for k, v in doc.items() if k not in ("model", "store", "previous_response_id")}
    return dataclasses.replace(parsed, request=dataclasses.replace(parsed.request, responses_wire=native))
