"""OpenAI's Responses API upstream: a /v1/responses request sent as written to a deployment that
serves `/responses` (Deployment.speaks_responses), and its answer read back into the chat pipeline's
OpenAI chat documents (which the gateway turns into a Response again for the caller).

Pure Python. The shapes are OpenAI's API reference's (Responses: the response object, its output
items and usage; Streaming: the response.* events):
- body: the caller's, with `model` the deployment's, `stream` as the call needs, and `store`
  false: Switchyard keeps the conversation itself (under the workflow's retention,
  inference.gateway.stored) and `previous_response_id` has already been made into `input`, so the
  provider is never asked to keep anything. Input items go without their `id` and `status`:
  with store false the provider knows no item by id.
- answer: `message` items' output_text (joined) and refusal parts, `function_call` items as
  tool calls (call_id, name, arguments as written); reasoning items are not part of a chat answer.
  status completed is finish_reason stop (tool_calls when there are calls); incomplete is length
  (max_output_tokens) or content_filter. usage: input_tokens (cached_tokens inside it, as in
  chat), output_tokens (reasoning_tokens inside it).
- stream: response.output_text.delta, response.refusal.delta and, per function_call item,
  response.output_item.added (the call's id and name) and response.function_call_arguments.delta
  become chat chunk events; response.completed / response.incomplete the finish and usage
  events; response.failed and `error` a failed call.
"""

from __future__ import annotations

import time
from typing import Any

from inference.adapters.base import StreamChunk, chat_chunk

_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}


def responses_body(wire: dict[str, Any], *, model: str, stream: bool) -> dict[str, Any]:
    body = {**wire, "model": model, "store": False}
    if isinstance(body.get("input"), list):
        # Item ids name items a provider stored; with store false it has none (a continued
        # conversation's items carry the ids Switchyard gave them), so the items go without.
        body["input"] = [
            {k: v for k, v in item.items() if k not in ("id", "status")} if isinstance(item, dict) else item
            for item in body["input"]
        ]
    if stream:
        body["stream"] = True
    else:
        body.pop("stream", None)
        body.pop("stream_options", None)
    return body


def chat_usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    usage = usage or {}
    tokens_in, tokens_out = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
    return {
        "prompt_tokens": tokens_in,
        "completion_tokens": tokens_out,
        "total_tokens": tokens_in + tokens_out,
        "prompt_tokens_details": {
            "cached_tokens": int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
        },
        "completion_tokens_details": {
            "reasoning_tokens": int((usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0)
        },
    }


def _finish(doc: dict[str, Any], calls: bool) -> str:
    if doc.get("status") == "incomplete":
        reason = (doc.get("incomplete_details") or {}).get("reason")
        return _INCOMPLETE.get(str(reason), "length")
    return "tool_calls" if calls else "stop"


def chat_from_response(doc: dict[str, Any]) -> dict[str, Any]:
    """A Response object as an OpenAI chat.completion document (choice 0)."""
    texts: list[str] = []
    refusals: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in doc["output"]:
        if item["type"] == "message":
            for part in item["content"]:
                if part["type"] == "output_text":
                    texts.append(str(part["text"]))
                elif part["type"] == "refusal":
                    refusals.append(str(part["refusal"]))
        elif item["type"] == "function_call":
            function = {"name": str(item["name"]), "arguments": str(item["arguments"])}
            calls.append({"id": str(item["call_id"]), "type": "function", "function": function})
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if (texts or not (calls or refusals)) else None,
        "refusal": "".join(refusals) or None,
    }
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "chatcmpl-responses",
        "object": "chat.completion",
        "created": int(doc.get("created_at") or time.time()),
        "model": str(doc.get("model") or ""),
        "choices": [
            {"index": 0, "message": message, "finish_reason": _finish(doc, bool(calls)), "logprobs": None}
        ],
        "usage": chat_usage(doc.get("usage")),
    }


class ResponseFailed(Exception):  # noqa: N818 (the provider's own failure event, wrapped)
    """response.failed or an `error` event: `code` is what the provider named it."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class ResponsesStreamMapper:
    """Responses stream events -> OpenAI chat.completion.chunk events (one StreamChunk each; the
    finish and usage events come from response.completed or response.incomplete)."""

    def __init__(self, *, model: str) -> None:
        self.model = model
        self.created = int(time.time())
        self.calls: dict[int, int] = {}  # output_index of a function_call item -> its tool-call index
        self.finished = False

    def _chunk(self, choices: list[dict[str, Any]], text: str = "", **fields: Any) -> StreamChunk:
        return chat_chunk(
            ident="chatcmpl-responses",
            created=self.created,
            model=self.model,
            choices=choices,
            text=text,
            **fields,
        )

    def _delta(self, delta: dict[str, Any], text: str = "") -> StreamChunk:
        return self._chunk([{"index": 0, "delta": delta, "finish_reason": None}], text)

    def event(self, doc: dict[str, Any]) -> list[StreamChunk]:
        kind = doc.get("type")
        if kind == "response.created":
            return [self._delta({"role": "assistant", "content": ""})]
        if kind == "response.output_text.delta":
            return [self._delta({"content": doc["delta"]}, doc["delta"])]
        if kind == "response.refusal.delta":
            return [self._delta({"refusal": doc["delta"]})]
        if kind == "response.output_item.added" and doc["item"]["type"] == "function_call":
            item = doc["item"]
            index = self.calls[int(doc["output_index"])] = len(self.calls)
            call = {
                "index": index,
                "id": str(item["call_id"]),
                "type": "function",
                "function": {"name": str(item["name"]), "arguments": ""},
            }
            return [self._delta({"tool_calls": [call]})]
        if kind == "response.function_call_arguments.delta":
            index = self.calls[int(doc["output_index"])]
            return [self._delta({"tool_calls": [{"index": index, "function": {"arguments": doc["delta"]}}]})]
        if kind in ("response.completed", "response.incomplete"):
            response = doc["response"]
            finish = _finish(response, bool(self.calls))
            usage = chat_usage(response.get("usage"))
            self.finished = True
            return [
                self._chunk([{"index": 0, "delta": {}, "finish_reason": finish}], finish_reason=finish),
                self._chunk(
                    [],
                    finish_reason=finish,
                    tokens_in=usage["prompt_tokens"],
                    tokens_out=usage["completion_tokens"],
                    cached_tokens=usage["prompt_tokens_details"]["cached_tokens"],
                    reasoning_tokens=usage["completion_tokens_details"]["reasoning_tokens"],
                    usage=usage,
                ),
            ]
        if kind == "response.failed":
            error = (doc.get("response") or {}).get("error") or {}
            raise ResponseFailed(str(error.get("code") or "server_error"))
        if kind == "error":
            raise ResponseFailed(str(doc.get("code") or "server_error"))
        return []  # in_progress, content_part.*, *.done, reasoning summaries: nothing to hand on
