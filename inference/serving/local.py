"""Serving a registered model artifact as an OpenAI-compatible HTTP server (`serve_model`).

The model is loaded by training.engine.model.model_for_serving: the DiLoCo engine's byte-level
GPT from a switchyard artifact (a prompt's tokens are its UTF-8 bytes; `usage` counts bytes in
and bytes out), or a Llama or GPT-2 from a directory in the open-weights layout, such as a
training run's final export (text in and out through the directory's tokenizer.json; `usage`
counts its tokens, and its end-of-sequence token ends the answer). Generation appends tokens
greedily (temperature 0 or unset) or by sampling softmax(logits / temperature); the answer is
decoded with errors="replace". Chat messages become one prompt
("role: content" lines, then "assistant:"). Requests are checked as the gateway checks them
(inference.gateway.openai_request): bad input is answered 400 with an OpenAI-style body.

A deployment whose base_url points here (and whose hosting_cluster is the cluster it runs on)
is routed like any OpenAI-compatible provider; its cost per token comes from
billing.selfhosted.
"""

from __future__ import annotations

import codecs
import json
import logging
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Protocol

from inference.adapters.base import prompt_text
from inference.gateway.openai_body import InvalidRequest, error_document, json_document
from inference.gateway.openai_request import chat_request_parse, completion_request_parse
from inference.serving.loopback_http import KeepAliveHandler

if TYPE_CHECKING:
    import torch

DEFAULT_MAX_TOKENS = 64
MAX_TOKENS_LIMIT = 1024
# The gateway's 2.5 MB body, re-encoded by the adapter with \u escapes, stays well under this.
MAX_BODY_BYTES = 16 * 1024 * 1024
_PATHS = ("/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions")
logger = logging.getLogger(__name__)


class TokenTextCodec(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteGenerator:
    """Greedy or temperature sampling from a causal LM (one request at a time).

    Without a tokenizer the tokens are UTF-8 bytes (the byte GPT). With one, each generated
    token yields the text it adds, as UTF-8 (empty while a character is still incomplete), so
    the pieces always join to the decoded answer.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        block_size: int,
        name: str,
        tokenizer: TokenTextCodec | None = None,
        eos_id: int | None = None,
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.name = name
        self.tokenizer = tokenizer
        self.eos_id = eos_id
        self._lock = threading.Lock()  # one forward pass at a time: CPU threads are shared

    def _prompt_ids(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            return list(prompt.encode("utf-8") or b"\n")
        return self.tokenizer.encode(prompt) or self.tokenizer.encode("\n")

    def generate(
        self,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float | None = None,
        stop: tuple[str, ...] = (),
        seed: int | None = None,
    ) -> tuple[list[bytes], int, str]:
        """(generated text as UTF-8, one piece per token; prompt length in tokens; finish reason)."""
        import torch  # slow to import: loaded when a model first generates

        ids = self._prompt_ids(prompt)
        prompt_len = len(ids)
        out: list[bytes] = []
        new: list[int] = []
        shown = ""
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        finish = "length"
        with self._lock, torch.no_grad():
            for _ in range(max_tokens):
                window = torch.tensor([ids[-self.block_size :]], dtype=torch.long)
                logits = self.model(window)[0, -1]
                if not temperature:
                    nxt = int(torch.argmax(logits))
                else:
                    probs = torch.softmax(logits / float(temperature), dim=-1)
                    nxt = int(torch.multinomial(probs, 1, generator=generator))
                if self.eos_id is not None and nxt == self.eos_id:
                    finish = "stop"
                    break
                ids.append(nxt)
                if self.tokenizer is None:
                    out.append(bytes([nxt]))
                else:
                    new.append(nxt)
                    text = self.tokenizer.decode(new)
                    # A byte-level BPE token may end inside a character: hold it back until
                    # the character is complete.
                    if text.endswith("\ufffd"):
                        out.append(b"")
                    else:
                        out.append(text[len(shown) :].encode("utf-8"))
                        shown = text
                if stop and any(s in b"".join(out).decode("utf-8", "replace") for s in stop):
                    finish = "stop"
                    break
        if self.tokenizer is not None and new:
            tail = self.tokenizer.decode(new)[len(shown) :]
            if tail:
                out[-1] += tail.encode("utf-8")
        return out, prompt_len, finish


def _json(handler: BaseHTTPRequestHandler, status: int, doc: dict[str, Any], *, close: bool = False) -> None:
    body = json.dumps(doc).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    if close:
        handler.send_header("Connection", "close")
        handler.close_connection = True
    handler.end_headers()
    handler.wfile.write(body)


def _bad(handler: BaseHTTPRequestHandler, exc: InvalidRequest, *, close: bool = False) -> None:
    doc = error_document(str(exc), type_="invalid_request_error", param=exc.param, code=exc.code)
    _json(handler, exc.status, doc, close=close)


def _not_found(handler: BaseHTTPRequestHandler) -> None:
    _json(handler, 404, error_document("not found", type_="invalid_request_error", code="unknown_url"))


def _body_length(handler: BaseHTTPRequestHandler) -> int:
    raw = handler.headers.get("Content-Length") or "0"
    try:
        length = int(raw)
    except ValueError:
        length = -1
    if length < 0:
        raise InvalidRequest("Content-Length is not a length", code="invalid_body")
    if length > MAX_BODY_BYTES:
        raise InvalidRequest(
            f"The request body is over {MAX_BODY_BYTES} bytes", code="request_too_large", status=413
        )
    return length


@dataclass(frozen=True)
class _Generation:
    chat: bool
    prompt: str
    max_tokens: int
    temperature: float | None
    stop: tuple[str, ...]
    seed: int | None
    stream: bool


def _generation(path: str, raw: bytes) -> _Generation:
    """The request, checked as the gateway checks it (inference.gateway.openai_request)."""
    doc = json_document(raw)
    chat = path in ("/v1/chat/completions", "/chat/completions")
    parse = chat_request_parse if chat else completion_request_parse
    parsed = parse(doc, require_model=False)
    request = parsed.request
    max_tokens = request.max_tokens or DEFAULT_MAX_TOKENS
    if max_tokens > MAX_TOKENS_LIMIT:
        raise InvalidRequest(
            f"max_tokens must be 1..{MAX_TOKENS_LIMIT}", param="max_tokens", code="invalid_max_tokens"
        )
    return _Generation(
        chat=chat,
        prompt=prompt_text(request),
        max_tokens=max_tokens,
        temperature=request.temperature,
        stop=request.stop,
        seed=parsed.seed,
        stream=parsed.stream,
    )


class _Handler(KeepAliveHandler):
    server: LocalModelServer

    def do_GET(self) -> None:  # noqa: N802 (stdlib naming)
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            name = self.server.generator.name
            _json(
                self,
                200,
                {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "switchyard"}]},
            )
        elif self.path == "/health":
            _json(self, 200, {"status": "ok"})
        else:
            _not_found(self)

    def do_POST(self) -> None:  # noqa: N802 (stdlib naming)
        # Every answer is a complete HTTP response: bad input is a 400 with an OpenAI-style body
        # (the caller's fault; a router does not count it against this server), never a dropped
        # connection, which a router must take for a dead server.
        try:
            length = _body_length(self)
        except InvalidRequest as exc:
            _bad(self, exc, close=True)  # the body was not read: the connection is done
            return
        raw = self.rfile.read(length)
        path = self.path.rstrip("/")
        if path not in _PATHS:
            _not_found(self)
            return
        try:
            req = _generation(path, raw)
        except InvalidRequest as exc:
            _bad(self, exc)
            return
        try:
            pieces, tokens_in, finish = self.server.generator.generate(
                req.prompt,
                max_tokens=req.max_tokens,
                temperature=req.temperature,
                stop=req.stop,
                seed=req.seed,
            )
        except Exception:
            logger.exception("generation failed")
            _json(
                self,
                500,
                error_document("The model failed to generate", type_="api_error", code="internal_error"),
            )
            return
        model = self.server.generator.name
        usage = {
            "prompt_tokens": tokens_in,
            "completion_tokens": len(pieces),
            "total_tokens": tokens_in + len(pieces),
        }
        created = int(time.time())
        chat = req.chat
        if req.stream:
            self._stream(chat, model, pieces, usage, finish, created)
            return
        text = b"".join(pieces).decode("utf-8", "replace")
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
            obj = "text_completion"
        _json(
            self,
            200,
            {
                "id": f"local-{created}",
                "object": obj,
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": usage,
            },
        )

    def _stream(
        self, chat: bool, model: str, pieces: list[bytes], usage: dict[str, int], finish: str, created: int
    ) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(doc: dict[str, Any] | str) -> None:
            payload = f"data: {doc if isinstance(doc, str) else json.dumps(doc)}\n\n".encode()
            self.wfile.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")

        obj = "chat.completion.chunk" if chat else "text_completion"
        # Bytes are decoded incrementally so a multi-byte character is never split across events.
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        for piece in pieces:
            text = decoder.decode(piece)
            if text:
                choice = (
                    {"index": 0, "delta": {"content": text}, "finish_reason": None}
                    if chat
                    else {"index": 0, "text": text, "finish_reason": None}
                )
                send(
                    {
                        "id": f"local-{created}",
                        "object": obj,
                        "created": created,
                        "model": model,
                        "choices": [choice],
                    }
                )
        tail = decoder.decode(b"", final=True)
        last = (
            {"index": 0, "delta": {"content": tail} if tail else {}, "finish_reason": finish}
            if chat
            else {"index": 0, "text": tail, "finish_reason": finish}
        )
        send({"id": f"local-{created}", "object": obj, "created": created, "model": model, "choices": [last]})
        send(
            {
                "id": f"local-{created}",
                "object": obj,
                "created": created,
                "model": model,
                "choices": [],
                "usage": usage,
            }
        )
        send("[DONE]")
        self.wfile.write(b"0\r\n\r\n")


class LocalModelServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, generator: ByteGenerator, *, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__((host, port), _Handler)
        self.generator = generator


def local_server_for_artifact(
    *, uri: str, name: str, host: str = "127.0.0.1", port: int = 0
) -> LocalModelServer:
    """Load the artifact (or open-weights directory) and bind the server (call serve_forever to run it)."""
    from training.engine.model import model_for_serving  # torch: loaded only when serving

    served = model_for_serving(uri=uri)
    generator = ByteGenerator(
        served.model,
        block_size=served.context_length,
        name=name,
        tokenizer=served.tokenizer,
        eos_id=served.eos_id,
    )
    return LocalModelServer(generator, host=host, port=port)
