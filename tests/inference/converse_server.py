"""A loopback HTTP server that speaks Bedrock Runtime's Converse and ConverseStream APIs.

Enough of the wire format for boto3's bedrock-runtime client: rest-json for Converse and
errors (x-amzn-ErrorType), and the binary event-stream encoding (prelude, headers, payload,
CRC32s) for ConverseStream. The tests point the client's endpoint_url at it.

It records every request (path and body, as botocore serialised it) in `behaviour.requests`.
The answer is `text`, or `blocks` when set: Converse content blocks (`{"text": ...}`,
`{"toolUse": {"toolUseId", "name", "input"}}`) with `stop_reason`. Streamed, a text block is
sent as word deltas; a toolUse block as contentBlockStart (id and name), its input as JSON in
fragments of `fragment` characters (contentBlockDelta toolUse.input) and contentBlockStop, as
ConverseStream sends them.
"""

from __future__ import annotations

import binascii
import json
import struct
from dataclasses import dataclass, field
from typing import Any

from inference.serving.loopback_http import KeepAliveHandler
from tests.inference.loopback_server import LoopbackServer


@dataclass
class ConverseBehaviour:
    text: str = "hello from bedrock"
    status: int = 200
    error_type: str = "ThrottlingException"
    tokens_in: int = 11
    tokens_out: int = 4
    blocks: list[dict[str, Any]] | None = None
    stop_reason: str = "end_turn"
    fragment: int = 7
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def content(self) -> list[dict[str, Any]]:
        return self.blocks if self.blocks is not None else [{"text": self.text}]

    def last_body(self) -> dict[str, Any]:
        return self.requests[-1][1]


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return (
        struct.pack("B", len(raw_name)) + raw_name + b"\x07" + struct.pack(">H", len(raw_value)) + raw_value
    )


def event_message(event_type: str, payload: dict[str, Any]) -> bytes:
    """One event-stream message (AWS event stream encoding: prelude CRC, message CRC)."""
    headers = (
        _header(":event-type", event_type)
        + _header(":content-type", "application/json")
        + _header(":message-type", "event")
    )
    body = json.dumps(payload).encode()
    total = 12 + len(headers) + len(body) + 4
    prelude = struct.pack(">II", total, len(headers))
    prelude += struct.pack(">I", binascii.crc32(prelude) & 0xFFFFFFFF)
    message = prelude + headers + body
    return message + struct.pack(">I", binascii.crc32(message) & 0xFFFFFFFF)


def _block_events(index: int, block: dict[str, Any], fragment: int) -> list[bytes]:
    """One content block as ConverseStream events."""
    out = []
    if "toolUse" in block:
        use = block["toolUse"]
        start = {"toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}
        out.append(event_message("contentBlockStart", {"contentBlockIndex": index, "start": start}))
        text = json.dumps(use["input"])
        for at in range(0, len(text), fragment):
            delta = {"toolUse": {"input": text[at : at + fragment]}}
            out.append(event_message("contentBlockDelta", {"contentBlockIndex": index, "delta": delta}))
    else:
        for i, word in enumerate(block["text"].split(" ")):
            piece = word if i == 0 else " " + word
            out.append(
                event_message("contentBlockDelta", {"contentBlockIndex": index, "delta": {"text": piece}})
            )
    out.append(event_message("contentBlockStop", {"contentBlockIndex": index}))
    return out


class _Handler(KeepAliveHandler):
    server: ConverseServer

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        b = self.server.behaviour
        b.requests.append((self.path, body))
        if b.status != 200:
            data = json.dumps({"message": f"mock {b.error_type}"}).encode()
            self.send_response(b.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("x-amzn-ErrorType", f"{b.error_type}:http://internal.amazon.com/")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        usage = {
            "inputTokens": b.tokens_in,
            "outputTokens": b.tokens_out,
            "totalTokens": b.tokens_in + b.tokens_out,
        }
        if self.path.endswith("/converse-stream"):
            messages = [event_message("messageStart", {"role": "assistant"})]
            for index, block in enumerate(b.content()):
                messages += _block_events(index, block, b.fragment)
            messages.append(event_message("messageStop", {"stopReason": b.stop_reason}))
            messages.append(event_message("metadata", {"usage": usage, "metrics": {"latencyMs": 1}}))
            data = b"".join(messages)
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.amazon.eventstream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        doc = {
            "output": {"message": {"role": "assistant", "content": b.content()}},
            "stopReason": b.stop_reason,
            "usage": usage,
            "metrics": {"latencyMs": 1},
        }
        data = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class ConverseServer(LoopbackServer):
    def __init__(self) -> None:
        super().__init__(_Handler)
        self.behaviour = ConverseBehaviour()

    @property
    def url(self) -> str:
        return self.root
