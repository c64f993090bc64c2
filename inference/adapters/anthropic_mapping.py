"""OpenAI Chat Completions <-> Anthropic Messages: requests, answers and stream events.

Anthropic's Messages API and Bedrock's Converse have one shape under two sets of names: a list of
system texts, alternating user and assistant turns of content blocks, tool-use and tool-result
blocks, tools with a JSON-schema input, auto / any / named tool choices and the same stop
reasons. So a chat request is mapped once, by inference.adapters.converse_mapping (tools, tool
choice, JSON mode as a forced tool, merged turns, every refusal), and this module renames:
the Converse arguments into a Messages body, and a Messages answer or stream event into the
Converse shape that module reads back into OpenAI documents. Pure Python, like that module.

The Messages shapes are those of Anthropic's API reference (Messages, Streaming Messages, Prompt
caching):
- body: `model`, `max_tokens` (required: the request's, else SWITCHYARD_MAX_OUTPUT_TOKENS, the
  figure budgets reserve for a request without one), `system` as text blocks, `messages` with
  `text`, `tool_use {id, name, input}` and `tool_result {tool_use_id, content}` blocks, `tools
  [{name, description, input_schema, strict}]`, `tool_choice {type: auto | any | tool, name,
  disable_parallel_tool_use}` (parallel_tool_calls: false), `temperature` (0 to 1 here, 0 to 2
  in OpenAI's: above 1 is refused), `top_p`, `stop_sequences`, `metadata.user_id` (from `user`),
  `output_config.effort` (from `reasoning_effort`: low, medium, high, xhigh or max).
- usage: `input_tokens` counts neither cache reads nor cache writes, which are
  `cache_read_input_tokens` and `cache_creation_input_tokens` beside it. The OpenAI usage handed
  on has `prompt_tokens` = all three, `prompt_tokens_details.cached_tokens` = the reads (billed
  at the cached-input price) and `.cache_write_tokens` = the writes (billed at the cache-write
  price where the price book has one, else as input). In a
  stream, message_start carries the input counts and message_delta cumulative counts (the output,
  and in newer API versions the input ones too): the latest of each is what was used.
- images: a chat request's `image_url` parts become `image` blocks ahead of the turn's text
  (a base64 data: URL as a base64 source, an http(s) URL as a url source; OpenAI's `detail`
  hint has no Messages equivalent and is left out); other part types (audio, files) are refused.
- answers: `text` and `tool_use` blocks are read; thinking blocks are not part of an OpenAI answer
  (this mapping never asks for thinking, so none come). stop_reason `refusal` is finish_reason
  `content_filter`; the others are Converse's names already.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from inference.adapters.base import ChatRequest, StreamChunk
from inference.adapters.converse_mapping import (
    CONVERSE_FIELDS,
    ConversePlan,
    ConverseStreamMapper,
    Unmappable,
    chat_answer,
    converse_request,
)

API_VERSION = "2023-06-01"  # the anthropic-version header: the Messages API's one version
MAX_TEMPERATURE = 1.0

# The client's chat fields this mapping carries: the Converse mapping's, and reasoning_effort as
# output_config.effort; any other but the accounting ones (base.ACCOUNTING_FIELDS; `user` is
# carried as metadata.user_id) is refused by name. Messages has no text completions.
CARRIED_FIELDS = (CONVERSE_FIELDS - {"prompt"}) | {"reasoning_effort"}
# Anthropic's output_config.effort values (OpenAI's minimal and none have no equal: refused).
EFFORTS = frozenset({"low", "medium", "high", "xhigh", "max"})

_STOP_REASONS = {"refusal": "content_filtered", "pause_turn": "end_turn"}  # others: Converse's names


def _block(block: dict[str, Any]) -> dict[str, Any]:
    """A Converse content block as a Messages one."""
    if "text" in block:
        return {"type": "text", "text": block["text"]}
    if "toolUse" in block:
        use = block["toolUse"]
        return {"type": "tool_use", "id": use["toolUseId"], "name": use["name"], "input": use["input"]}
    if "image" in block:
        image = block["image"]
        source = (
            {"type": "url", "url": image["url"]}
            if "url" in image
            else {"type": "base64", "media_type": image["media_type"], "data": image["data"]}
        )
        return {"type": "image", "source": source}
    result = block["toolResult"]
    texts = [
        part["text"] if "text" in part else json.dumps(part["json"], ensure_ascii=False)
        for part in result["content"]
    ]
    return {"type": "tool_result", "tool_use_id": result["toolUseId"], "content": "".join(texts)}


def _tool(spec: dict[str, Any]) -> dict[str, Any]:
    tool = {"name": spec["name"], "input_schema": spec["inputSchema"]["json"]}
    for name in ("description", "strict"):
        if name in spec:
            tool[name] = spec[name]
    return tool


def _tool_choice(choice: dict[str, Any]) -> dict[str, Any]:
    if "tool" in choice:
        return {"type": "tool", "name": choice["tool"]["name"]}
    return {"type": "any" if "any" in choice else "auto"}


def messages_body(
    request: ChatRequest, *, model: str, default_max_tokens: int
) -> tuple[dict[str, Any], ConversePlan]:
    """The Messages body for a chat request, and the plan reading its answer needs (raises
    Unmappable for what Messages cannot take)."""
    if request.temperature is not None and request.temperature > MAX_TEMPERATURE:
        raise Unmappable(f"temperature must be at most {MAX_TEMPERATURE:g} (Anthropic's range is 0 to 1)")
    plan = converse_request(request, model_id=model)
    args = plan.args
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": request.max_tokens or default_max_tokens,
        "messages": [
            {"role": m["role"], "content": [_block(b) for b in m["content"]]} for m in args["messages"]
        ],
    }
    if "system" in args:
        body["system"] = [{"type": "text", "text": b["text"]} for b in args["system"]]
    config = args.get("toolConfig")
    if config is not None:
        body["tools"] = [_tool(t["toolSpec"]) for t in config["tools"]]
        choice = _tool_choice(config.get("toolChoice") or {"auto": {}})
        if plan.single_call:
            choice["disable_parallel_tool_use"] = True
        body["tool_choice"] = choice
    for name, value in (("temperature", request.temperature), ("top_p", request.top_p)):
        if value is not None:
            body[name] = value
    if request.stop:
        body["stop_sequences"] = list(request.stop)
    wire = request.wire or {}
    if wire.get("user"):
        body["metadata"] = {"user_id": wire["user"]}
    effort = wire.get("reasoning_effort")
    if effort is not None:
        if effort not in EFFORTS:
            raise Unmappable(
                f"reasoning_effort must be one of {', '.join(sorted(EFFORTS))} for Anthropic's effort"
            )
        body["output_config"] = {"effort": effort}
    return body, plan


# --- Answers ----------------------------------------------------------------------------------------


@dataclass
class Usage:
    """A Messages usage object's counts (input_tokens without the cache's)."""

    input: int = 0
    cache_read: int = 0
    cache_write: int = 0
    output: int = 0

    def update(self, usage: dict[str, Any] | None) -> None:
        """Take the counts `usage` reports (cumulative: the latest stands), leaving the others."""
        for attr, name in (
            ("input", "input_tokens"),
            ("cache_read", "cache_read_input_tokens"),
            ("cache_write", "cache_creation_input_tokens"),
            ("output", "output_tokens"),
        ):
            value = (usage or {}).get(name)
            if value is not None:
                setattr(self, attr, int(value))

    @property
    def prompt(self) -> int:
        return self.input + self.cache_read + self.cache_write

    def openai(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt,
            "completion_tokens": self.output,
            "total_tokens": self.prompt + self.output,
            "prompt_tokens_details": {
                "cached_tokens": self.cache_read,
                "cache_write_tokens": self.cache_write,
            },
        }


def _stop_reason(reason: Any) -> str:
    return _STOP_REASONS.get(str(reason), str(reason))


def chat_from_message(
    doc: dict[str, Any], plan: ConversePlan, *, model: str
) -> tuple[str, str, dict[str, Any], Usage]:
    """A Messages answer as (content text, finish_reason, OpenAI chat.completion document, usage)."""
    blocks = []
    for block in doc["content"]:
        if block["type"] == "text":
            blocks.append({"text": block["text"]})
        elif block["type"] == "tool_use":
            blocks.append(
                {"toolUse": {"toolUseId": block["id"], "name": block["name"], "input": block["input"]}}
            )
    converse = {
        "output": {"message": {"content": blocks}},
        "stopReason": _stop_reason(doc.get("stop_reason")),
    }
    text, finish, raw = chat_answer(converse, plan, model=model)
    usage = Usage()
    usage.update(doc.get("usage"))
    raw["usage"] = usage.openai()
    return text, finish, raw, usage


class StreamFailed(Exception):  # noqa: N818 (the provider's own error event, wrapped)
    """An `error` event in the stream: `kind` is Anthropic's error type (overloaded_error, ...)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class MessagesStreamMapper:
    """Messages stream events -> OpenAI chat.completion.chunk events (through ConverseStreamMapper,
    as Converse's events): the role first, text and tool-call deltas, then the finish event and
    the usage event when message_delta ends the message."""

    def __init__(self, plan: ConversePlan, *, model: str) -> None:
        self._converse = ConverseStreamMapper(plan, model=model)
        self.usage = Usage()
        self.finished = False

    def _converse_event(self, event: dict[str, Any]) -> list[StreamChunk]:
        chunk = self._converse.event(event)
        return [] if chunk is None else [chunk]

    def event(self, doc: dict[str, Any]) -> list[StreamChunk]:
        kind = doc.get("type")
        if kind == "message_start":
            self.usage.update(doc["message"].get("usage"))
            return self._converse_event({"messageStart": {"role": "assistant"}})
        if kind == "content_block_start":
            index, block = int(doc["index"]), doc["content_block"]
            if block["type"] == "tool_use":
                use = {"toolUseId": block["id"], "name": block["name"]}
                return self._converse_event(
                    {"contentBlockStart": {"contentBlockIndex": index, "start": {"toolUse": use}}}
                )
            if block["type"] == "text" and block.get("text"):
                return self._delta(index, {"text": block["text"]})
            return []
        if kind == "content_block_delta":
            index, delta = int(doc["index"]), doc["delta"]
            if delta["type"] == "text_delta":
                return self._delta(index, {"text": delta["text"]})
            if delta["type"] == "input_json_delta":
                return self._delta(index, {"toolUse": {"input": delta["partial_json"]}})
            return []  # thinking, signatures, citations: not part of an OpenAI answer
        if kind == "message_delta":
            self.usage.update(doc.get("usage"))
            self.finished = True
            stop = self._converse_event(
                {"messageStop": {"stopReason": _stop_reason(doc["delta"].get("stop_reason"))}}
            )
            usage = {"inputTokens": self.usage.prompt, "outputTokens": self.usage.output}
            last = self._converse_event({"metadata": {"usage": usage}})
            return stop + [
                dataclasses.replace(
                    c,
                    cached_tokens=self.usage.cache_read,
                    cache_write_tokens=self.usage.cache_write,
                    raw={**(c.raw or {}), "usage": self.usage.openai()},
                )
                for c in last
            ]
        if kind == "error":
            raise StreamFailed(str((doc.get("error") or {}).get("type") or "error"))
        return []  # ping, content_block_stop, message_stop

    def _delta(self, index: int, delta: dict[str, Any]) -> list[StreamChunk]:
        return self._converse_event({"contentBlockDelta": {"contentBlockIndex": index, "delta": delta}})
