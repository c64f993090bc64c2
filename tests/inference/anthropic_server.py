"""A loopback HTTP server that speaks Anthropic's Messages API (`POST /v1/messages`).

It records every request (path, headers, body) in `behaviour.requests` and answers `blocks`
(Messages content blocks: `{"type": "text", "text"}`, `{"type": "tool_use", "id", "name",
"input"}`) with `stop_reason` and `usage` (input_tokens without the cache's, and the cache read
and write counts). Asked to stream, it sends what Anthropic's API sends: message_start (the input
counts, output 1), per block content_block_start, deltas (text by words, a tool's input as JSON in
pieces of `fragment` characters), content_block_stop, a ping, then message_delta (stop_reason,
the cumulative output count) and message_stop, each as an `event:` and a `data:` line.
`status` makes it fail with Anthropic's error document; `stream_error` sends an error event after
the first block instead of finishing, and `truncate` ends the stream after the blocks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from inference.serving.loopback_http import KeepAliveHandler
from tests.inference.loopback_server import LoopbackServer


@dataclass
class MessagesBehaviour:
    blocks: list[dict[str, Any]] = field(
        default_factory=lambda: [{"type": "text", "text": "hello from claude"}]
    )
    stop_reason: str = "end_turn"
    usage: dict[str, int] = field(
        default_factory=lambda: {
            "input_tokens": 9,
            "cache_read_input_tokens": 20,
            "cache_creation_input_tokens": 5,
            "output_tokens": 4,
        }
    )
    status: int = 200
    error_type: str = "overloaded_error"
    stream_error: str = ""
    truncate: bool = False
    fragment: int = 6
    requests: list[tuple[str, dict[str, str], dict[str, Any]]] = field(default_factory=list)

    def last_body(self) -> dict[str, Any]:
        return self.requests[-1][2]

    def message(self) -> dict[str, Any]:
        return {
            "id": "msg_loopback",
            "type": "message",
            "role": "assistant",
            "model": "claude-loopback",
            "content": self.blocks,
            "stop_reason": self.stop_reason,
            "stop_sequence": None,
            "usage": self.usage,
        }


def _event(kind: str, doc: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **doc})}\n\n".encode()


def _block_events(index: int, block: dict[str, Any], fragment: int) -> list[bytes]:
    out = []
    if block["type"] == "tool_use":
        start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        out.append(_event("content_block_start", {"index": index, "content_block": start}))
        text = json.dumps(block["input"])
        for at in range(0, len(text), fragment):
            delta = {"type": "input_json_delta", "partial_json": text[at : at + fragment]}
            out.append(_event("content_block_delta", {"index": index, "delta": delta}))
    else:
        start = {"type": "text", "text": ""}
        out.append(_event("content_block_start", {"index": index, "content_block": start}))
        for i, word in enumerate(block["text"].split(" ")):
            delta = {"type": "text_delta", "text": word if i == 0 else " " + word}
            out.append(_event("content_block_delta", {"index": index, "delta": delta}))
    out.append(_event("content_block_stop", {"index": index}))
    return out


class _Handler(KeepAliveHandler):
    server: MessagesServer

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        b = self.server.behaviour
        b.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        if b.status != 200:
            error = {"type": "error", "error": {"type": b.error_type, "message": "mock failure"}}
            self._send(b.status, json.dumps(error).encode(), "application/json")
            return
        if not body.get("stream"):
            self._send(200, json.dumps(b.message()).encode(), "application/json")
            return
        head = {**b.message(), "content": [], "stop_reason": None, "usage": {**b.usage, "output_tokens": 1}}
        events = [_event("message_start", {"message": head})]
        for index, block in enumerate(b.blocks):
            events += _block_events(index, block, b.fragment)
            if b.stream_error:
                events.append(_event("error", {"error": {"type": b.stream_error, "message": "mock"}}))
                break
            events.append(_event("ping", {}))
        if not (b.stream_error or b.truncate):
            delta = {"stop_reason": b.stop_reason, "stop_sequence": None}
            events.append(
                _event(
                    "message_delta", {"delta": delta, "usage": {"output_tokens": b.usage["output_tokens"]}}
                )
            )
            events.append(_event("message_stop", {}))
        self._send(200, b"".join(events), "text/event-stream")


class MessagesServer(LoopbackServer):
    def __init__(self) -> None:
        super().__init__(_Handler)
        self.behaviour = MessagesBehaviour()

    @property
    def url(self) -> str:
        return self.root
