"""OpenAI Chat Completions <-> Bedrock Runtime Converse: requests, answers and stream events.

Pure Python (no boto3, no Django): the Bedrock adapter (inference.adapters.bedrock) sends what
`converse_request` builds and hands back what `chat_answer` and `ConverseStreamMapper` make, so
the gateway passes Bedrock's answers on as it does an OpenAI-compatible provider's. Anthropic's
Messages API has Converse's shape under other names, so the Anthropic adapter builds on the same
mapping (inference.adapters.anthropic_mapping renames its blocks); refusals name no service, the
adapter that raises them does.

The shapes are the Converse API reference's
(https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_Converse.html and
API_runtime_ConverseStream.html) and the user guide's tool use
(https://docs.aws.amazon.com/bedrock/latest/userguide/tool-use.html):

- `tools[].function` -> `toolConfig.tools[].toolSpec {name, description, inputSchema.json,
  strict}`; `tool_choice` auto -> `{auto: {}}`, required -> `{any: {}}`, a named function ->
  `{tool: {name}}`; none -> no toolConfig at all (Converse has no "none"), and then the
  history's tool turns are sent as text, since Converse refuses toolUse / toolResult blocks in a
  request without a toolConfig.
- An assistant's `tool_calls` -> `toolUse {toolUseId, name, input}` blocks (input: the parsed
  arguments, a JSON object); `role: tool` turns -> `toolResult {toolUseId, content: [{json}]}`
  when the content is a JSON object, else `[{text}]`, in a user message. Consecutive turns of one
  role are merged into one message (Converse wants user and assistant to alternate; several
  tool results answer one assistant turn).
- JSON mode. Converse's own `outputConfig.textFormat` (a JSON schema) is served by few models
  and, for Anthropic's, only for schemas whose objects all say `additionalProperties: false`;
  so JSON mode is the tool-use way the user guide describes for forcing a tool: one extra tool
  whose `inputSchema` is the caller's schema (`json_schema.schema`, `strict` carried), named
  after `json_schema.name`, and forced with `{tool: {name}}`; `json_object` gets the permissive
  schema `{"type": "object"}` under the name `json_object`. The tool's input comes back as the
  message content (a JSON string), never as a tool call. With tools of the caller's and
  tool_choice auto, the JSON tool joins them under `{any: {}}` (the model either calls a tool or
  answers through the JSON tool); with required or a named tool a call is forced anyway and the
  JSON tool is left out.
- Answers: `toolUse` blocks -> `message.tool_calls[{id, type: function, function: {name,
  arguments}}]` (arguments: the input as a JSON string); stopReason tool_use -> finish_reason
  tool_calls (stop when only the JSON tool was used). Streamed: contentBlockStart's toolUse ->
  a tool-call delta with index, id and name; contentBlockDelta's toolUse.input fragments ->
  argument deltas (content deltas for the JSON tool).
- `parallel_tool_calls: false` has no Converse field: only the first call is handed back.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

from inference.adapters.base import (
    ChatMessage,
    ChatRequest,
    StreamChunk,
    chat_chunk,
    tool_arguments_object,
)

# Converse's ToolName: [a-zA-Z0-9_-]+, 1 to 64 characters (OpenAI's function names are the same).
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
JSON_OBJECT_TOOL = "json_object"
_JSON_TOOL_DESCRIPTION = "Give the final answer as this tool's input: a JSON value that follows its schema."

FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
}


# The chat fields this mapping carries (n = 1 only; a completion's prompt as one user turn).
CONVERSE_FIELDS = frozenset(
    {
        "prompt",  # a completion request: one user turn
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "stop",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
    }
)


class Unmappable(ValueError):
    """The request asks for something Converse cannot express (the adapter answers 400)."""


@dataclass(frozen=True)
class ConversePlan:
    """The Converse call for a chat request, and what reading its answer needs."""

    args: dict[str, Any]
    json_tool: str | None = None  # the forced tool whose input is the answer (JSON mode)
    single_call: bool = False  # parallel_tool_calls: false


# --- Requests ---------------------------------------------------------------------------------------


def _tool_use(call: dict[str, Any], where: str) -> dict[str, Any]:
    if call.get("type") != "function":
        raise Unmappable(f"{where}.type must be function: only function tool calls are mapped")
    function = call["function"]
    arguments = tool_arguments_object(function["arguments"])
    if arguments is None:
        raise Unmappable(f"{where}.function.arguments must be a JSON object (a tool call's input is one)")
    return {"toolUse": {"toolUseId": call["id"], "name": function["name"], "input": arguments}}


def _tool_result(message: ChatMessage) -> dict[str, Any]:
    value = tool_arguments_object(message.content) if message.content.strip() else None
    block: dict[str, Any] = {"json": value} if value is not None else {"text": message.content}
    return {"toolResult": {"toolUseId": message.tool_call_id, "content": [block]}}


def _as_text(message: ChatMessage) -> list[dict[str, Any]]:
    """A tool turn as text, for a request without toolConfig (tool_choice none)."""
    if message.role == "tool":
        return [{"text": f"[result of tool call {message.tool_call_id}]\n{message.content}"}]
    blocks = [{"text": message.content}] if message.content else []
    for call in message.tool_calls:
        function = call.get("function") or {}
        blocks.append(
            {"text": f"[tool call {call.get('id')}: {function.get('name')}({function.get('arguments')})]"}
        )
    return blocks


def _messages(
    request: ChatRequest, *, tool_blocks: bool
) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    system: list[dict[str, str]] = []
    messages: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for i, m in enumerate(request.messages):
        if m.role in ("system", "developer"):
            system.append({"text": m.content})
        elif m.role == "assistant" and m.tool_calls:
            if tool_blocks:
                blocks = [{"text": m.content}] if m.content else []
                where = f"messages[{i}].tool_calls"
                blocks += [_tool_use(call, f"{where}[{j}]") for j, call in enumerate(m.tool_calls)]
            else:
                blocks = _as_text(m)
            add("assistant", blocks)
        elif m.role == "tool":
            add("user", [_tool_result(m)] if tool_blocks else _as_text(m))
        else:
            images = [_image(p, f"messages[{i}].content") for p in m.parts if p.get("type") == "image_url"]
            text = [{"text": m.content}] if (m.content or not images) else []
            add("assistant" if m.role == "assistant" else "user", [*images, *text])
    return system, messages


_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})


def _image(part: dict[str, Any], where: str) -> dict[str, Any]:
    """An image_url part as an image block of this mapping, ahead of the turn's text:
    `{"image": {"media_type", "data"}}` for a base64 data: URL, `{"image": {"url"}}` for an
    http(s) one. Only the Messages renaming takes them (anthropic_mapping); the Bedrock adapter
    refuses image parts before mapping (Converse wants the bytes, and no URL)."""
    url = str((part.get("image_url") or {}).get("url", ""))
    if url.startswith("data:"):
        head, _, data = url.partition(",")
        media_type = head[5:].split(";")[0]
        if ";base64" not in head or media_type not in _IMAGE_TYPES:
            raise Unmappable(
                f"{where}: an image must be a base64 data: URL of a JPEG, PNG, GIF or WebP image"
            )
        return {"image": {"media_type": media_type, "data": data}}
    if url.startswith(("https://", "http://")):
        return {"image": {"url": url}}
    raise Unmappable(f"{where}: an image URL must be http(s) or a data: URL")


def _tool_specs(tools: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    specs = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise Unmappable(f"tools[{i}].type must be function: only function tools are mapped")
        function = tool["function"]
        if not _TOOL_NAME.fullmatch(function["name"]):
            raise Unmappable(f"tools[{i}].function.name must be 1 to 64 letters, digits, _ or -")
        spec: dict[str, Any] = {
            "name": function["name"],
            "inputSchema": {"json": function.get("parameters") or {"type": "object", "properties": {}}},
        }
        if function.get("description"):
            spec["description"] = function["description"]
        if function.get("strict"):
            spec["strict"] = True
        specs.append({"toolSpec": spec})
    return specs


def _tool_choice(request: ChatRequest, names: list[str]) -> tuple[str, str | None]:
    """("auto" | "none" | "required" | "named" | "default", the named tool)."""
    choice = request.tool_choice
    if choice is None:
        return "default", None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise Unmappable("tool_choice must be none, auto, required or a named function")
        if choice == "required" and not names:
            raise Unmappable("tool_choice required needs tools")
        return choice, None
    function = choice.get("function")
    if (
        choice.get("type") != "function"
        or not isinstance(function, dict)
        or not isinstance(function.get("name"), str)
    ):
        raise Unmappable("tool_choice must name a function: {type: function, function: {name}}")
    if function["name"] not in names:
        raise Unmappable(f"tool_choice names {function['name'][:64]!r}, which is not one of the tools")
    return "named", function["name"]


def _json_tool(request: ChatRequest, names: list[str]) -> dict[str, Any] | None:
    """The toolSpec of JSON mode (see the module docstring), or None."""
    fmt = request.response_format or {}
    kind = fmt.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        spec: dict[str, Any] = {"name": JSON_OBJECT_TOOL, "inputSchema": {"json": {"type": "object"}}}
    elif kind == "json_schema":
        schema = fmt["json_schema"]
        if not _TOOL_NAME.fullmatch(schema["name"]):
            raise Unmappable("response_format.json_schema.name must be 1 to 64 letters, digits, _ or -")
        spec = {"name": schema["name"], "inputSchema": {"json": schema.get("schema") or {"type": "object"}}}
        if schema.get("strict"):
            spec["strict"] = True
    else:
        raise Unmappable(f"response_format.type {str(kind)[:32]!r} is not text, json_object or json_schema")
    if spec["name"] in names:
        raise Unmappable(f"response_format's name {spec['name']!r} is also a tool's: they must differ")
    description = fmt.get("json_schema", {}).get("description") if kind == "json_schema" else None
    spec["description"] = description or _JSON_TOOL_DESCRIPTION
    return {"toolSpec": spec}


def converse_request(request: ChatRequest, *, model_id: str) -> ConversePlan:
    """The Converse arguments for a chat request (raises Unmappable)."""
    specs = _tool_specs(request.tools)
    names = [s["toolSpec"]["name"] for s in specs]
    mode, named = _tool_choice(request, names)
    json_spec = _json_tool(request, names)
    if mode in ("required", "named"):
        json_spec = None  # a call is forced: there is no answer for the JSON tool to carry
    offered = specs if mode != "none" else []
    config: dict[str, Any] | None = None
    if json_spec is not None:
        json_name = json_spec["toolSpec"]["name"]
        tools = [*offered, json_spec]
        choice: dict[str, Any] = {"tool": {"name": json_name}} if not offered else {"any": {}}
        config = {"tools": tools, "toolChoice": choice}
    elif offered:
        config = {"tools": offered}
        if mode == "auto":
            config["toolChoice"] = {"auto": {}}
        elif mode == "required":
            config["toolChoice"] = {"any": {}}
        elif mode == "named":
            config["toolChoice"] = {"tool": {"name": named}}
    # Tool turns travel as blocks only beside the caller's tools (see the module docstring).
    system, messages = _messages(request, tool_blocks=bool(offered))
    args: dict[str, Any] = {"modelId": model_id, "messages": messages}
    if system:
        args["system"] = system
    if config is not None:
        args["toolConfig"] = config
    wire = request.wire or {}
    return ConversePlan(
        args=args,
        json_tool=json_spec["toolSpec"]["name"] if json_spec is not None else None,
        single_call=wire.get("parallel_tool_calls") is False,
    )


# --- Answers ----------------------------------------------------------------------------------------


def _arguments(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _usage(tokens_in: int, tokens_out: int) -> dict[str, int]:
    return {
        "prompt_tokens": tokens_in,
        "completion_tokens": tokens_out,
        "total_tokens": tokens_in + tokens_out,
    }


def chat_answer(doc: dict[str, Any], plan: ConversePlan, *, model: str) -> tuple[str, str, dict[str, Any]]:
    """A Converse answer as (content text, finish_reason, OpenAI chat.completion document)."""
    pieces: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in doc["output"]["message"]["content"]:
        if "text" in block:
            pieces.append(str(block["text"]))
        elif "toolUse" in block:
            use = block["toolUse"]
            if use["name"] == plan.json_tool:
                pieces.append(_arguments(use["input"]))
            elif not (plan.single_call and calls):
                calls.append(
                    {
                        "id": str(use["toolUseId"]),
                        "type": "function",
                        "function": {"name": str(use["name"]), "arguments": _arguments(use["input"])},
                    }
                )
    text = "".join(pieces)
    finish = FINISH.get(str(doc.get("stopReason")), "stop")
    if finish == "tool_calls" and not calls:
        finish = "stop"  # only the JSON tool answered
    message: dict[str, Any] = {"role": "assistant", "content": text if (text or not calls) else None}
    if calls:
        message["tool_calls"] = calls
    usage = doc.get("usage") or {}
    raw = {
        "id": "chatcmpl-bedrock",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": _usage(int(usage.get("inputTokens") or 0), int(usage.get("outputTokens") or 0)),
    }
    return text, finish, raw


class ConverseStreamMapper:
    """ConverseStream events -> OpenAI chat.completion.chunk events, one StreamChunk each.

    Chunks carry the event in `raw` (the gateway passes them on); the last two are the finish
    event and the usage event (choices empty), the order OpenAI streams in.
    """

    def __init__(self, plan: ConversePlan, *, model: str) -> None:
        self.plan = plan
        self.model = model
        self.created = int(time.time())
        self.finish = "stop"
        self.calls = 0
        # contentBlockIndex -> the tool call's index, "json" for the JSON tool, None: left out
        self.blocks: dict[int, int | str | None] = {}

    def _chunk(self, choices: list[dict[str, Any]], text: str = "", **fields: Any) -> StreamChunk:
        return chat_chunk(
            ident="chatcmpl-bedrock",
            created=self.created,
            model=self.model,
            choices=choices,
            text=text,
            **fields,
        )

    def _delta(self, delta: dict[str, Any], text: str = "") -> StreamChunk:
        return self._chunk([{"index": 0, "delta": delta, "finish_reason": None}], text)

    def event(self, event: dict[str, Any]) -> StreamChunk | None:
        if "messageStart" in event:
            return self._delta({"role": "assistant", "content": ""})
        if "contentBlockStart" in event:
            start = event["contentBlockStart"]
            use = (start.get("start") or {}).get("toolUse")
            if use is None:
                return None
            index = int(start.get("contentBlockIndex", 0))
            if use.get("name") == self.plan.json_tool:
                self.blocks[index] = "json"
                return None
            if self.plan.single_call and self.calls:
                self.blocks[index] = None
                return None
            self.blocks[index] = self.calls
            self.calls += 1
            call = {
                "index": self.blocks[index],
                "id": str(use["toolUseId"]),
                "type": "function",
                "function": {"name": str(use["name"]), "arguments": ""},
            }
            return self._delta({"tool_calls": [call]})
        if "contentBlockDelta" in event:
            block = event["contentBlockDelta"]
            delta = block.get("delta") or {}
            if delta.get("text"):
                return self._delta({"content": delta["text"]}, delta["text"])
            fragment = (delta.get("toolUse") or {}).get("input")
            if not fragment:
                return None  # reasoning, citations: not part of an OpenAI answer
            where = self.blocks.get(int(block.get("contentBlockIndex", 0)))
            if where == "json":
                return self._delta({"content": fragment}, fragment)
            if isinstance(where, int):
                return self._delta({"tool_calls": [{"index": where, "function": {"arguments": fragment}}]})
            return None
        if "messageStop" in event:
            self.finish = FINISH.get(str(event["messageStop"].get("stopReason")), "stop")
            if self.finish == "tool_calls" and not self.calls:
                self.finish = "stop"
            return self._chunk(
                [{"index": 0, "delta": {}, "finish_reason": self.finish}], finish_reason=self.finish
            )
        if "metadata" in event:
            usage = event["metadata"].get("usage") or {}
            tokens_in, tokens_out = int(usage.get("inputTokens") or 0), int(usage.get("outputTokens") or 0)
            return self._chunk(
                [],
                finish_reason=self.finish,
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                usage=_usage(tokens_in, tokens_out),
            )
        return None
