"""A loopback HTTP server that speaks OpenAI's Responses API (`POST /v1/responses`).

It records every request (path, headers, body) in `behaviour.requests` and answers a Response
object whose `output` is `items` (message items with output_text, function_call items), with
`usage` (cached and reasoning token details) and `status` (`incomplete` with `incomplete_reason`).
Asked to stream, it sends what OpenAI sends: response.created, per item output_item.added, text
deltas by words or the call's arguments in pieces of `fragment` characters, output_item.done,
then response.completed (or response.incomplete) with the whole response; `fail` sends
response.failed with that error code instead of finishing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from inference.serving.loopback_http import KeepAliveHandler
from tests.inference.loopback_server import LoopbackServer


def text_item(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": "msg_up",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def call_item(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


@dataclass
class ResponsesBehaviour:
    items: list[dict[str, Any]] = field(default_factory=lambda: [text_item("hello from responses")])
    usage: dict[str, Any] = field(
        default_factory=lambda: {
            "input_tokens": 30,
            "input_tokens_details": {"cached_tokens": 12},
            "output_tokens": 8,
            "output_tokens_details": {"reasoning_tokens": 3},
            "total_tokens": 38,
        }
    )
    status: str = "completed"
    incomplete_reason: str = "max_output_tokens"
    fail: str = ""
    fragment: int = 5
    requests: list[tuple[str, dict[str, str], dict[str, Any]]] = field(default_factory=list)

    def last_body(self) -> dict[str, Any]:
        return self.requests[-1][2]

    def response(self) -> dict[str, Any]:
        return {
            "id": "resp_upstream",
            "object": "response",
            "created_at": 1_700_000_000,
            "status": self.status,
            "incomplete_details": {"reason": self.incomplete_reason} if self.status == "incomplete" else None,
            "error": None,
            "model": "gpt-upstream",
            "output": [{"type": "reasoning", "id": "rs_1", "summary": []}, *self.items],
            "usage": self.usage,
        }


def _event(kind: str, **doc: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **doc})}\n\n".encode()


def _item_events(index: int, item: dict[str, Any], fragment: int) -> list[bytes]:
    if item["type"] == "function_call":
        added = {**item, "arguments": "", "status": "in_progress"}
        out = [_event("response.output_item.added", output_index=index, item=added)]
        text = item["arguments"]
        for at in range(0, len(text), fragment):
            out.append(
                _event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=index,
                    delta=text[at : at + fragment],
                )
            )
    else:
        added = {**item, "content": [], "status": "in_progress"}
        out = [_event("response.output_item.added", output_index=index, item=added)]
        text = item["content"][0]["text"]
        for i, word in enumerate(text.split(" ")):
            out.append(
                _event(
                    "response.output_text.delta",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    delta=word if i == 0 else " " + word,
                )
            )
    out.append(_event("response.output_item.done", output_index=index, item=item))
    return out


class _Handler(KeepAliveHandler):
    server: ResponsesServer

    def _send(self, data: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        b = self.server.behaviour
        b.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        whole = b.response()
        if not body.get("stream"):
            self._send(json.dumps(whole).encode(), "application/json")
            return
        events = [_event("response.created", response={**whole, "status": "in_progress", "output": []})]
        for index, item in enumerate(whole["output"]):
            if item["type"] != "reasoning":
                events += _item_events(index, item, b.fragment)
        if b.fail:
            error = {"code": b.fail, "message": "mock failure"}
            events.append(_event("response.failed", response={**whole, "status": "failed", "error": error}))
        else:
            kind = "response.incomplete" if b.status == "incomplete" else "response.completed"
            events.append(_event(kind, response=whole))
        self._send(b"".join(events), "text/event-stream")


class ResponsesServer(LoopbackServer):
    def __init__(self) -> None:
        super().__init__(_Handler)
        self.behaviour = ResponsesBehaviour()

    @property
    def url(self) -> str:
        return self.root + "/v1"
