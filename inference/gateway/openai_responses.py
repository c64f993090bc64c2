"""OpenAI's Responses API (`POST /v1/responses`) as a parse/respond pair on the chat pipeline.

As with Anthropic's Messages (inference.gateway.anthropic_messages), a Responses body is translated
into the chat request it means and checked by `chat_request_parse`; the chat answer, plain or
streamed, is translated back into a Response object and the Responses stream events. Every
deployment of the workflow can answer (OpenAI-compatible providers get the chat body, Bedrock
gets it through Converse). A field or item that a chat route cannot carry is a 400 naming it,
never a silent drop (a gateway that falls back from Responses to chat and loses fields is the
bug users report of other gateways).

Written from OpenAI's published API reference (Responses, its streaming events, the input item
types); the support table in docs/inference.md lists each field as passed, translated or refused.

Not built: Switchyard keeps no responses. `store` is answered `false`, `previous_response_id`
is a 400 that says to send the conversation in `input`, and GET/DELETE of a response are 404s
(inference.gateway.views).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from inference.gateway.openai_body import InvalidRequest, field_error
from inference.gateway.openai_request import ParsedRequest, chat_request_parse

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
    "background": "background responses need a response store, which Switchyard does not keep",
    "conversation": "conversations need a response store, which Switchyard does not keep",
    "prompt": "prompt templates live in OpenAI's dashboard",
    "max_tool_calls": "limits OpenAI's built-in tools, which a chat route does not run",
    "top_logprobs": "logprobs are not translated back into output_text items",
}


def _error(where: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{where} {message}", param=where, code="invalid_request")


def _text_of(parts: Any, where: str, kinds: tuple[str, ...]) -> tuple[str, list[dict[str, Any]]]:
    """A message's content: its text and its chat content parts (input_image as image_url)."""
    if isinstance(parts, str):
        return parts, [{"type": "text", "text": parts}]
    if not isinstance(parts, list):
        raise _error(where, "must be a string or a list of content parts")
    text: list[str] = []
    chat: list[dict[str, Any]] = []
    for i, part in enumerate(parts):
        at = f"{where}[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in kinds and kind != "input_image":
            value = part.get("text")
            if not isinstance(value, str):
                raise _error(f"{at}.text", "must be a string")
            text.append(value)
            chat.append({"type": "text", "text": value})
        elif kind == "input_image" and "input_image" in kinds:
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise _error(
                    f"{at}.image_url", "must be a URL or a data: URL (file ids need OpenAI's file store)"
                )
            image: dict[str, Any] = {"url": url}
            if part.get("detail") is not None:
                image["detail"] = part["detail"]
            chat.append({"type": "image_url", "image_url": image})
        else:
            raise _error(f"{at}.type", f"must be one of {', '.join(kinds)}")
    return "".join(text), chat


def _input(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """`instructions` and `input` as chat messages; function_call items join the assistant turn
    they belong to, function_call_output items become `tool` messages."""
    chat: list[dict[str, Any]] = []
    instructions = doc.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _error("instructions", "must be a string")
        chat.append({"role": "system", "content": instructions})
    value = doc.get("input")
    if isinstance(value, str):
        return [*chat, {"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise _error("input", "must be a string or a non-empty list of input items")
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _error(where, "must be an input item object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise _error(f"{where}.role", "must be user, assistant, system or developer")
            kinds = ("output_text", "refusal") if role == "assistant" else ("input_text", "input_image")
            text, parts = _text_of(item.get("content"), f"{where}.content", kinds)
            if role == "assistant" or all(p["type"] == "text" for p in parts):
                chat.append({"role": role, "content": text})
            else:
                chat.append({"role": role, "content": parts})
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
            for key, got in (("call_id", call_id), ("name", name), ("arguments", arguments)):
                if not isinstance(got, str):
                    raise _error(f"{where}.{key}", "must be a string")
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
                raise _error(f"{where}.call_id", "must be the call_id of the function_call it answers")
            text, _ = _text_of(output, f"{where}.output", ("input_text",))
            chat.append({"role": "tool", "tool_call_id": call_id, "content": text})
        else:
            raise _error(f"{where}.type", f"{kind!r} cannot be carried to this workflow's deployments")
    return chat


def _tools(doc: dict[str, Any], chat: dict[str, Any]) -> None:
    _tool_choice(doc, chat)
    tools = doc.get("tools")
    if tools is None:
        return
    if not isinstance(tools, list):
        raise _error("tools", "must be a list of tools")
    out = []
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise _error(f"{at}.type", "must be function: built-in tools run on OpenAI's side only")
        function = {
            k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None
        }
        extra = set(tool) - {"type", "name", "description", "parameters", "strict"}
        if extra:
            raise _error(f"{at}.{sorted(extra)[0]}", "cannot be carried to this workflow's deployments")
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
        raise _error("tool_choice", "must be none, auto, required or {'type': 'function', 'name': ...}")


def _text_format(doc: dict[str, Any], chat: dict[str, Any]) -> None:
    text = doc.get("text")
    if text is None:
        return
    if not isinstance(text, dict):
        raise _error("text", "must be an object")
    for key in text:
        if key not in ("format", "verbosity"):
            raise _error(f"text.{key}", "is not a field of text")
    if text.get("verbosity") is not None:
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
        raise _error("text.format.type", "must be text, json_object or json_schema")


def responses_to_chat(doc: dict[str, Any]) -> dict[str, Any]:
    """The chat document a Responses body means (see the module docstring)."""
    for name in doc:
        if name in _REFUSED:
            raise _error(name, _REFUSED[name])
        if name not in _HANDLED:
            raise _error(name, "cannot be carried to this workflow's deployments")
    if doc.get("previous_response_id") is not None:
        raise _error(
            "previous_response_id",
            "cannot be used: Switchyard keeps no responses; send the whole conversation in input",
        )
    store = doc.get("store")
    if store is not None and not isinstance(store, bool):
        raise _error("store", "must be true or false")
    if doc.get("truncation") not in (None, "disabled"):
        raise _error("truncation", "must be disabled: a chat route does not truncate the conversation")
    if doc.get("include"):
        raise _error("include", "asks for output a chat route does not produce")
    chat: dict[str, Any] = {"model": doc.get("model"), "messages": _input(doc)}
    for name in _SAME:
        if doc.get(name) is not None:
            chat[name] = doc[name]
    if doc.get("safety_identifier") is not None and "user" not in chat:
        chat["user"] = doc["safety_identifier"]
    if doc.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = doc["max_output_tokens"]
    _tools(doc, chat)
    _text_format(doc, chat)
    reasoning = doc.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise _error("reasoning", "must be an object")
        for key, value in reasoning.items():
            if key == "effort":
                if value is not None:
                    chat["reasoning_effort"] = value
            elif value is not None:
                raise _error(f"reasoning.{key}", "cannot be carried: a chat answer has no reasoning summary")
    if doc.get("stream") is True:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    elif doc.get("stream") not in (None, False):
        raise _error("stream", "must be true or false")
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
    try:
        return chat_request_parse(chat)
    except InvalidRequest as exc:
        param = exc.param or ""
        head = param.split(".")[0].split("[")[0]
        if head in ("tools", "tool_choice"):
            param = head
        else:
            param = _PARAMS.get(head, param)
        raise InvalidRequest(str(exc), param=param or None, code=exc.code, status=exc.status) from exc


# --- Answers --------------------------------------------------------------------------------------------


def response_id(request_id: int | None) -> str:
    return f"resp_sy{request_id}"


def _usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        },
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": int(
                (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
            )
        },
        "total_tokens": prompt + completion,
    }


def _echo(request: dict[str, Any]) -> dict[str, Any]:
    """The request's settings, as a Response object repeats them."""
    text = request.get("text") or {}
    reasoning = request.get("reasoning") or {}
    return {
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "metadata": request.get("metadata") or {},
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": {"effort": reasoning.get("effort"), "summary": None},
        "store": False,
        "temperature": request.get("temperature"),
        "text": {"format": text.get("format") or {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p"),
        "truncation": "disabled",
        "user": request.get("user"),
    }


def _message_item(ident: str, text: str, refusal: str | None, status: str = "completed") -> dict[str, Any]:
    part: dict[str, Any] = (
        {"type": "refusal", "refusal": refusal}
        if refusal
        else {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    )
    return {"id": ident, "type": "message", "role": "assistant", "status": status, "content": [part]}


def _call_item(ident: str, call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    function = call.get("function") or {}
    return {
        "id": ident,
        "type": "function_call",
        "status": status,
        "call_id": call.get("id"),
        "name": function.get("name"),
        "arguments": function.get("arguments") or "",
    }


def response_document(
    *,
    request_id: int | None,
    model: str,
    request: dict[str, Any],
    text: str,
    refusal: str | None,
    calls: list[dict[str, Any]],
    finish: str,
    usage: dict[str, Any] | None,
    created: int,
    status: str = "completed",
) -> dict[str, Any]:
    rid = response_id(request_id)
    output: list[dict[str, Any]] = []
    if text or refusal or not calls:
        output.append(_message_item(f"msg_sy{request_id}", text, refusal))
    output.extend(_call_item(f"fc_sy{request_id}_{k}", call) for k, call in enumerate(calls))
    incomplete = finish == "length" and status == "completed"
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": "incomplete" if incomplete else status,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "model": model,
        "output": output if status != "in_progress" else [],
        **_echo(request),
        "usage": _usage(usage) if status != "in_progress" else None,
    }


def chat_to_response(
    chat: dict[str, Any], *, request_id: int | None, model: str, request: dict[str, Any]
) -> dict[str, Any]:
    """A chat answer (choice 0: Responses has no `n`) as a Response object."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    return response_document(
        request_id=request_id,
        model=model,
        request=request,
        text=message.get("content") or "",
        refusal=message.get("refusal"),
        calls=list(message.get("tool_calls") or []),
        finish=choice.get("finish_reason") or "stop",
        usage=chat.get("usage"),
        created=int(chat.get("created") or time.time()),
    )


@dataclass
class ResponsesStream:
    """Chat stream events in, Responses stream events out, each with its sequence_number:
    response.created and response.in_progress; for the text, output_item.added, content_part.added,
    output_text.delta..., output_text.done, content_part.done, output_item.done; for each tool
    call, output_item.added, function_call_arguments.delta..., function_call_arguments.done,
    output_item.done; then response.completed (or response.incomplete) with the usage."""

    request_id: int | None
    model: str
    request: dict[str, Any]
    created: int = field(default_factory=lambda: int(time.time()))
    _seq: int = 0
    _index: int = -1  # the open output item's index
    _open: str | None = None  # "text" or "tool:<k>"
    _text: str = ""
    _refusal: str = ""
    _calls: list[dict[str, Any]] = field(default_factory=list)
    _finish: str = "stop"
    _usage: dict[str, Any] | None = None

    def _event(self, kind: str, **body: Any) -> bytes:
        doc = {"type": kind, "sequence_number": self._seq, **body}
        self._seq += 1
        return f"event: {kind}\ndata: ".encode() + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

    def _document(self, status: str) -> dict[str, Any]:
        return response_document(
            request_id=self.request_id,
            model=self.model,
            request=self.request,
            text=self._text,
            refusal=self._refusal or None,
            calls=self._calls,
            finish=self._finish,
            usage=self._usage,
            created=self.created,
            status=status,
        )

    def start(self) -> Iterator[bytes]:
        yield self._event("response.created", response=self._document("in_progress"))
        yield self._event("response.in_progress", response=self._document("in_progress"))

    def _item_id(self) -> str:
        if self._open == "text":
            return f"msg_sy{self.request_id}"
        return f"fc_sy{self.request_id}_{len(self._calls) - 1}"

    def _close(self) -> Iterator[bytes]:
        if self._open is None:
            return
        ident, index = self._item_id(), self._index
        if self._open == "text":
            item = _message_item(ident, self._text, self._refusal or None)
            part = item["content"][0]
            if not self._refusal:
                yield self._event(
                    "response.output_text.done",
                    item_id=ident,
                    output_index=index,
                    content_index=0,
                    text=self._text,
                    logprobs=[],
                )
            yield self._event(
                "response.content_part.done", item_id=ident, output_index=index, content_index=0, part=part
            )
        else:
            item = _call_item(ident, self._calls[-1])
            yield self._event(
                "response.function_call_arguments.done",
                item_id=ident,
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            )
        yield self._event("response.output_item.done", output_index=index, item=item)
        self._open = None

    def feed(self, chunk: dict[str, Any]) -> Iterator[bytes]:
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text, refusal = delta.get("content"), delta.get("refusal")
            if text or refusal:
                if self._open != "text":
                    yield from self._close()
                    self._index += 1
                    self._open = "text"
                    item = _message_item(f"msg_sy{self.request_id}", "", None, status="in_progress")
                    item["content"] = []
                    yield self._event("response.output_item.added", output_index=self._index, item=item)
                    part: dict[str, Any] = (
                        {"type": "refusal", "refusal": ""}
                        if refusal
                        else {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                    )
                    yield self._event(
                        "response.content_part.added",
                        item_id=self._item_id(),
                        output_index=self._index,
                        content_index=0,
                        part=part,
                    )
                if text:
                    self._text += text
                    yield self._event(
                        "response.output_text.delta",
                        item_id=self._item_id(),
                        output_index=self._index,
                        content_index=0,
                        delta=text,
                        logprobs=[],
                    )
                if refusal:
                    self._refusal += refusal
                    yield self._event(
                        "response.refusal.delta",
                        item_id=self._item_id(),
                        output_index=self._index,
                        content_index=0,
                        delta=refusal,
                    )
            for call in delta.get("tool_calls") or []:
                kind = f"tool:{call.get('index', 0)}"
                function = call.get("function") or {}
                if self._open != kind:
                    yield from self._close()
                    self._index += 1
                    self._open = kind
                    self._calls.append(
                        {
                            "id": call.get("id"),
                            "type": "function",
                            "function": {"name": function.get("name"), "arguments": ""},
                        }
                    )
                    item = _call_item(self._item_id(), self._calls[-1], status="in_progress")
                    yield self._event("response.output_item.added", output_index=self._index, item=item)
                piece = function.get("arguments")
                if piece:
                    self._calls[-1]["function"]["arguments"] += piece
                    yield self._event(
                        "response.function_call_arguments.delta",
                        item_id=self._item_id(),
                        output_index=self._index,
                        delta=piece,
                    )
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]

    def end(self, switchyard: dict[str, Any] | None) -> Iterator[bytes]:
        yield from self._close()
        final = self._document("completed")
        if switchyard is not None:
            final["switchyard"] = switchyard
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield self._event(kind, response=final)
