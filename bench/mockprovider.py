"""A loopback OpenAI-compatible provider that answers at once, for tests, drills and the bench.

Its behaviour can be changed while it runs (`server.behaviour.status = 503`), so a test or the
bench can make a healthy provider fail mid-traffic. It speaks HTTP/1.1 keep-alive, the chat and
completion endpoints (streaming too, with a usage chunk) and /models.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from inference.serving.loopback_http import KeepAliveHandler


@dataclass
class Behaviour:
    status: int = 200
    text: str = "pong"
    delay_ms: float = 0.0
    malformed: bool = False
    tokens_in: int = 7
    tokens_out: int = 3
    # Requests seen, by path; the last request body.
    calls: dict[str, int] = field(default_factory=dict)
    last_body: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def total_calls(self) -> int:
        with self.lock:
            return sum(self.calls.values())


class _Handler(KeepAliveHandler):
    server: MockProviderServer

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (stdlib naming)
        if self.path.rstrip("/").endswith("/models"):
            body = {"object": "list", "data": [{"id": "mock-model", "object": "model", "owned_by": "mock"}]}
            self._send(200, json.dumps(body).encode())
        else:
            self._send(404, b'{"error": {"message": "not found"}}')

    def do_POST(self) -> None:  # noqa: N802 (stdlib naming)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        b = self.server.behaviour
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            self._send(400, b'{"error": {"message": "body is not JSON", "type": "invalid_request_error"}}')
            return
        with b.lock:
            b.calls[self.path] = b.calls.get(self.path, 0) + 1
            b.last_body = body
        if b.delay_ms:
            time.sleep(b.delay_ms / 1000.0)
        if b.status != 200:
            message = json.dumps({"error": {"message": f"mock failure {b.status}", "type": "server_error"}})
            self._send(b.status, message.encode())
            return
        if b.malformed:
            self._send(200, b"{not json")
            return
        chat = self.path.endswith("/chat/completions")
        if not chat and not self.path.endswith("/completions"):
            self._send(404, b'{"error": {"message": "unknown path"}}')
            return
        model = str(body.get("model") or "mock-model")
        usage = {
            "prompt_tokens": b.tokens_in,
            "completion_tokens": b.tokens_out,
            "total_tokens": b.tokens_in + b.tokens_out,
        }
        if body.get("stream"):
            self._stream(chat, model, b.text, usage)
            return
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": b.text},
                "finish_reason": "stop",
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": b.text, "finish_reason": "stop", "logprobs": None}
            obj = "text_completion"
        doc = {
            "id": "mock-1",
            "object": obj,
            "created": 0,
            "model": model,
            "choices": [choice],
            "usage": usage,
        }
        self._send(200, json.dumps(doc).encode())

    def _stream(self, chat: bool, model: str, text: str, usage: dict[str, int]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def event(doc: dict[str, Any] | str) -> None:
            data = doc if isinstance(doc, str) else json.dumps(doc)
            payload = f"data: {data}\n\n".encode()
            self.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")

        obj = "chat.completion.chunk" if chat else "text_completion"
        words = text.split(" ")
        for i, word in enumerate(words):
            piece = word if i == 0 else " " + word
            choice: dict[str, Any] = (
                {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                if chat
                else {"index": 0, "text": piece, "finish_reason": None}
            )
            event({"id": "mock-1", "object": obj, "created": 0, "model": model, "choices": [choice]})
        last: dict[str, Any] = (
            {"index": 0, "delta": {}, "finish_reason": "stop"}
            if chat
            else {"index": 0, "text": "", "finish_reason": "stop"}
        )
        event({"id": "mock-1", "object": obj, "created": 0, "model": model, "choices": [last]})
        event({"id": "mock-1", "object": obj, "created": 0, "model": model, "choices": [], "usage": usage})
        event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")


class MockProviderServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, behaviour: Behaviour | None = None, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.behaviour = behaviour or Behaviour()
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def start(self) -> MockProviderServer:
        # stop()'s shutdown waits for the loop's next poll: 50 ms, not the default 0.5 s (tests
        # start and stop one or two of these per test).
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.05}, name="mock-provider", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
