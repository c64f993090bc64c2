"""A loopback OpenAI-compatible provider that records every body it receives and answers a
scripted document, for the conformance suite.

The answer to a chat request is `answer` (a whole `chat.completion` document, with whatever
fields the test needs: tool calls, refusal, logprobs, several choices, usage details). Asked to
stream, it sends the same answer as OpenAI does: a role event per choice, content pieces, tool-call
deltas (the call's id, type and name first, then its arguments in pieces), logprobs per piece,
a finish event per choice, and the usage event when `stream_options.include_usage` is set.
So a client that reassembles a stream must get back exactly the non-streamed answer.

`status` and `headers` make it fail (a 429 with Retry-After); embeddings answer `embedding`
for every input, or `embed(text)` when the script has that function.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from inference.serving.loopback_http import KeepAliveHandler
from tests.inference.loopback_server import LoopbackServer


def chat_answer(
    content: str | None = "hello there",
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str = "stop",
    usage: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-provider-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "provider-model",
        "system_fingerprint": "fp_loopback",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": usage or {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
        **extra,
    }


@dataclass
class Script:
    answer: dict[str, Any] = field(default_factory=chat_answer)
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    embedding: list[float] = field(default_factory=lambda: [0.25, -0.5, 0.125])
    embedding_tokens: int = 4
    embed: Callable[[str], list[float]] | None = None
    bodies: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def last_body(self) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.bodies[-1][1])

    def calls(self) -> int:
        with self.lock:
            return len(self.bodies)


def _pieces(text: str) -> list[str]:
    words = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


def stream_events(answer: dict[str, Any], *, include_usage: bool) -> list[dict[str, Any]]:
    """The answer as OpenAI streams it (see the module docstring)."""
    head = {k: answer[k] for k in ("id", "created", "model", "system_fingerprint") if k in answer}
    head["object"] = "chat.completion.chunk"

    def event(choices: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
        return {**head, "choices": choices, **more}

    events = []
    for choice in answer["choices"]:
        i = choice["index"]
        message = choice["message"]
        events.append(
            event([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        )
        logprobs = (choice.get("logprobs") or {}).get("content") or []
        for n, piece in enumerate(_pieces(message["content"]) if message.get("content") else []):
            lp = {"content": logprobs[n : n + 1], "refusal": None} if logprobs else None
            events.append(
                event([{"index": i, "delta": {"content": piece}, "finish_reason": None, "logprobs": lp}])
            )
        if message.get("refusal"):
            events.append(
                event([{"index": i, "delta": {"refusal": message["refusal"]}, "finish_reason": None}])
            )
        for k, call in enumerate(message.get("tool_calls") or []):
            first = {
                "index": k,
                "id": call["id"],
                "type": call["type"],
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            events.append(event([{"index": i, "delta": {"tool_calls": [first]}, "finish_reason": None}]))
            args = call["function"]["arguments"]
            for part in (args[: len(args) // 2], args[len(args) // 2 :]):
                delta = {"tool_calls": [{"index": k, "function": {"arguments": part}}]}
                events.append(event([{"index": i, "delta": delta, "finish_reason": None}]))
        events.append(event([{"index": i, "delta": {}, "finish_reason": choice["finish_reason"]}]))
    if include_usage:
        events.append(event([], usage=answer["usage"]))
    return events


class _Handler(KeepAliveHandler):
    server: RecordingProvider

    def _send(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 (stdlib naming)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        script = self.server.script
        with script.lock:
            script.bodies.append((self.path, body))
        if script.status != 200:
            error = {"error": {"message": f"loopback {script.status}", "type": "rate_limit_error"}}
            self._send(script.status, error, script.headers)
            return
        if self.path.endswith("/embeddings"):
            inputs = body.get("input")
            inputs = inputs if isinstance(inputs, list) else [inputs]
            data = [
                {
                    "object": "embedding",
                    "index": i,
                    "embedding": script.embed(text) if script.embed else script.embedding,
                }
                for i, text in enumerate(inputs)
            ]
            tokens = script.embedding_tokens * len(inputs)
            usage = {"prompt_tokens": tokens, "total_tokens": tokens}
            self._send(200, {"object": "list", "data": data, "model": body.get("model"), "usage": usage})
            return
        if not body.get("stream"):
            self._send(200, script.answer)
            return
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for doc in [*stream_events(script.answer, include_usage=include_usage), "[DONE]"]:
            data = doc if isinstance(doc, str) else json.dumps(doc)
            payload = f"data: {data}\n\n".encode()
            self.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")


class RecordingProvider(LoopbackServer):
    def __init__(self) -> None:
        super().__init__(_Handler)
        self.script = Script()

    @property
    def base_url(self) -> str:
        return self.root + "/v1"
