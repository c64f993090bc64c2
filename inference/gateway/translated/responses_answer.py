"""OpenAI Responses answers from the chat pipeline's: a chat answer as a Response object, and the
chat stream as the Responses stream events (the request side is
inference.gateway.translated.responses_request)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from inference.gateway.translated.common import answer_text, arguments_text, choice_deltas, new_tool_call


def response_id(request_id: int | None) -> str:
    return f"resp_sy{request_id}"


def _usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    details = usage.get("prompt_tokens_details") or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": int(details.get("cached_tokens") or 0),
            "cache_write_tokens": int(details.get("cache_write_tokens") or 0),
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
        "previous_response_id": request.get("previous_response_id"),
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
        "arguments": arguments_text(function.get("arguments")),
    }


def response_document(
    *,
    request_id: int | None,
    model: str,
    request: dict[str, Any],
    output: list[dict[str, Any]],
    finish: str,
    usage: dict[str, Any] | None,
    created: int,
    status: str = "completed",
    error: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Response object; `status` in_progress (no output or usage yet), completed (incomplete
    when the answer stopped for length) or failed (with `error`)."""
    incomplete = finish == "length" and status == "completed"
    return {
        "id": response_id(request_id),
        "object": "response",
        "created_at": created,
        "status": "incomplete" if incomplete else status,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": error,
        "model": model,
        "output": output if status != "in_progress" else [],
        **_echo(request),
        "usage": _usage(usage) if status != "in_progress" else None,
    }


def chat_to_response(
    chat: dict[str, Any], *, request_id: int | None, model: str, request: dict[str, Any]
) -> dict[str, Any]:
    """A chat answer (choice 0: Responses has no `n`) as a Response object: a message item (also
    when the answer is empty, so that output_text reads ''), then a function_call item per call."""
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    text, refusal = answer_text(message.get("content")), answer_text(message.get("refusal"))
    calls = list(message.get("tool_calls") or [])
    output: list[dict[str, Any]] = []
    if text or refusal or not calls:
        output.append(_message_item(f"msg_sy{request_id}_0", text, refusal or None))
    output.extend(_call_item(f"fc_sy{request_id}_{len(output)}", call) for call in calls)
    return response_document(
        request_id=request_id,
        model=model,
        request=request,
        output=output,
        finish=choice.get("finish_reason") or "stop",
        usage=chat.get("usage"),
        created=int(chat.get("created") or time.time()),
    )


@dataclass
class ResponsesStream:
    """Chat stream events in, Responses stream events out, each with its sequence_number:
    response.created and response.in_progress; for each text run, output_item.added,
    content_part.added, output_text.delta (or refusal.delta)..., output_text.done,
    content_part.done, output_item.done; for each tool call, output_item.added,
    function_call_arguments.delta..., function_call_arguments.done, output_item.done; then
    response.completed (or response.incomplete) with the usage, whose output is the items in the
    order they were streamed, or response.failed when the provider's stream broke.

    Item ids carry the output index (`msg_sy<request>_<n>`, `fc_sy<request>_<n>`), so a text run
    after a tool call is an item of its own, as in the plain answer."""

    request_id: int | None
    model: str
    request: dict[str, Any]
    created: int = field(default_factory=lambda: int(time.time()))
    _seq: int = 0
    _output: list[dict[str, Any]] = field(default_factory=list)  # the items closed so far
    _open: str | None = None  # "text", or "tool:<tool-call id>" (common.new_tool_call)
    _text: str = ""
    _refusal: str = ""
    _call: dict[str, Any] | None = None  # the open tool call, chat-shaped
    _finish: str = "stop"
    _usage: dict[str, Any] | None = None

    def _event(self, kind: str, **body: Any) -> bytes:
        doc = {"type": kind, "sequence_number": self._seq, **body}
        self._seq += 1
        return f"event: {kind}\ndata: ".encode() + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

    def _document(self, status: str, error: dict[str, str] | None = None) -> dict[str, Any]:
        return response_document(
            request_id=self.request_id,
            model=self.model,
            request=self.request,
            output=list(self._output),
            finish=self._finish,
            usage=self._usage,
            created=self.created,
            status=status,
            error=error,
        )

    def start(self) -> Iterator[bytes]:
        yield self._event("response.created", response=self._document("in_progress"))
        yield self._event("response.in_progress", response=self._document("in_progress"))

    @property
    def _index(self) -> int:  # the open item's output index
        return len(self._output)

    def _item_id(self) -> str:
        return f"{'msg' if self._open == 'text' else 'fc'}_sy{self.request_id}_{self._index}"

    def _open_text(self, refusal: bool) -> Iterator[bytes]:
        yield from self._close()
        self._open, self._text, self._refusal = "text", "", ""
        item = _message_item(self._item_id(), "", None, status="in_progress")
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

    def _close(self) -> Iterator[bytes]:
        if self._open is None:
            return
        ident, index = self._item_id(), self._index
        if self._open == "text":
            item = _message_item(ident, self._text, self._refusal or None)
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
                "response.content_part.done",
                item_id=ident,
                output_index=index,
                content_index=0,
                part=item["content"][0],
            )
        else:
            item = _call_item(ident, self._call or {})
            yield self._event(
                "response.function_call_arguments.done",
                item_id=ident,
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            )
        yield self._event("response.output_item.done", output_index=index, item=item)
        self._output.append(item)
        self._open = None

    def feed(self, chunk: dict[str, Any]) -> Iterator[bytes]:
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for delta, finish in choice_deltas(chunk):
            text, refusal = answer_text(delta.get("content")), answer_text(delta.get("refusal"))
            if text and (self._open != "text" or self._refusal):
                yield from self._open_text(refusal=False)
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
                if self._open != "text" or self._text:
                    yield from self._open_text(refusal=True)
                self._refusal += refusal
                yield self._event(
                    "response.refusal.delta",
                    item_id=self._item_id(),
                    output_index=self._index,
                    content_index=0,
                    delta=refusal,
                )
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                kind = new_tool_call(call, self._open)
                if kind is not None:
                    yield from self._close()
                    self._open = kind
                    self._call = {
                        "id": call.get("id"),
                        "type": "function",
                        "function": {"name": function.get("name"), "arguments": ""},
                    }
                    item = _call_item(self._item_id(), self._call, status="in_progress")
                    yield self._event("response.output_item.added", output_index=self._index, item=item)
                piece = arguments_text(function.get("arguments"))
                if piece and self._call is not None:
                    self._call["function"]["arguments"] += piece
                    yield self._event(
                        "response.function_call_arguments.delta",
                        item_id=self._item_id(),
                        output_index=self._index,
                        delta=piece,
                    )
            if finish:
                self._finish = finish

    def end(self, switchyard: dict[str, Any] | None, *, broken: bool) -> Iterator[bytes]:
        if not self._output and self._open is None:
            yield from self._open_text(refusal=False)  # an empty answer: one empty message, as plain
        yield from self._close()
        if broken:
            error = {
                "code": "server_error",
                "message": "The provider's stream broke: the answer is incomplete",
            }
            final = self._document("failed", error)
        else:
            final = self._document("completed")
        if switchyard is not None:
            final["switchyard"] = switchyard
        kind = {"failed": "response.failed", "incomplete": "response.incomplete"}.get(
            final["status"], "response.completed"
        )
        yield self._event(kind, response=final)
