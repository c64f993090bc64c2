"""OpenAI-compatible providers over HTTP (OpenAI, vLLM, llama.cpp, our own serve_model).

The client is http.client with one keep-alive connection per (thread, host): measured on the
bench's loopback mock it adds well under 0.1 ms per call, where urllib3's PoolManager adds a few
tenths of a millisecond of bookkeeping. A connection the server closed while idle is detected
on the next use and reopened once (the request had not been processed: the server closed
before reading it).

Connections are opened through the outbound guard (registry.outbound.guard) under the provider's
policy; redirects are not followed; an upstream error body is logged here and never becomes part
of an error message (which reaches callers, attempts, failover events and batch output).
"""

from __future__ import annotations

import email.utils
import http.client
import json
import logging
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from inference.adapters.base import (
    ChatRequest,
    Completion,
    EmbeddingRequest,
    InferenceInput,
    ProviderError,
    StreamChunk,
    Target,
    classify_status,
)
from registry.failover_codes import FailoverCode
from registry.outbound.guard import PRIVATE_ALLOWED, PUBLIC_ONLY, OutboundRefused, guarded_connection

logger = logging.getLogger(__name__)
_local = threading.local()

# (scheme, host, port, may reach private networks): a connection vetted under one policy is
# never reused for a target under a stricter one.
ConnKey = tuple[str, str, int, bool]


def _connections() -> dict[ConnKey, http.client.HTTPConnection]:
    conns = getattr(_local, "conns", None)
    if conns is None:
        conns = _local.conns = {}
    return conns


def _key(base_url: str, allow_private: bool) -> ConnKey:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ProviderError(
            f"base URL {base_url!r} is not http(s)", retryable=False, code=FailoverCode.ENDPOINT_REFUSED
        )
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname, port, allow_private


def _connection(key: ConnKey, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
    """A kept-alive connection for this thread, and whether it is fresh.

    A fresh one is opened through the outbound guard (registry.outbound.guard): the host is
    resolved (cached briefly), its addresses checked against the provider's policy, and the
    socket connected to the address checked. A kept-alive one costs no lookup at all.
    """
    conns = _connections()
    conn = conns.get(key)
    if conn is not None:
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn, False
    scheme, host, port, allow_private = key
    conn = guarded_connection(
        scheme, host, port, timeout=timeout, policy=PRIVATE_ALLOWED if allow_private else PUBLIC_ONLY
    )
    conns[key] = conn
    return conn, True


def connection_drop(key: ConnKey) -> None:
    conn = _connections().pop(key, None)
    if conn is not None:
        conn.close()


def close_all() -> None:
    """Close this thread's kept-alive connections (tests, server shutdown)."""
    for conn in _connections().values():
        conn.close()
    _connections().clear()


def request_json(
    base_url: str,
    path: str,
    body: dict[str, Any] | None,
    *,
    headers: dict[str, str],
    timeout: float,
    allow_private: bool = False,
    method: str = "POST",
) -> tuple[http.client.HTTPResponse, ConnKey]:
    """Send one request on the kept-alive connection; the open response and its connection key.

    Connect errors and timeouts become retryable ProviderErrors, a destination the outbound
    guard refuses a non-retryable one. The caller reads the body (or streams it) and must read
    it to the end so the connection can be reused. Redirects are answers, never followed.
    """
    key = _key(base_url, allow_private)
    scheme, host, port, _ = key
    prefix = urlsplit(base_url).path.rstrip("/")
    payload = json.dumps(body, separators=(",", ":")).encode() if body is not None else None
    all_headers = {"Content-Type": "application/json", "Accept": "application/json", **headers}
    for _ in range(2):
        conn, fresh = _connection(key, timeout)
        try:
            if fresh:
                conn.connect()
                # One write per request already; NODELAY keeps streamed uploads from waiting.
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.request(method, prefix + path, body=payload, headers=all_headers)
            return conn.getresponse(), key
        except OutboundRefused as exc:
            connection_drop(key)
            raise ProviderError(str(exc), retryable=False, code=FailoverCode.ENDPOINT_REFUSED) from exc
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
            connection_drop(key)
            if fresh:
                raise ProviderError(
                    f"connection to {host}:{port} failed: {exc}",
                    retryable=True,
                    code=FailoverCode.CONNECTION_ERROR,
                ) from exc
            # A kept-alive connection the server had closed: reopen once.
            continue
        except TimeoutError as exc:
            connection_drop(key)
            raise ProviderError(
                f"timed out after {timeout:.2f}s calling {host}:{port}",
                retryable=True,
                code=FailoverCode.TIMEOUT,
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            connection_drop(key)
            raise ProviderError(
                f"cannot reach {host}:{port}: {exc}", retryable=True, code=FailoverCode.CONNECTION_ERROR
            ) from exc
    raise ProviderError(
        f"connection to {host}:{port} keeps closing", retryable=True, code=FailoverCode.CONNECTION_ERROR
    )


def read_body(resp: http.client.HTTPResponse, key: ConnKey) -> bytes:
    try:
        data = resp.read()
    except TimeoutError as exc:
        connection_drop(key)
        raise ProviderError(
            "timed out reading the answer", retryable=True, code=FailoverCode.TIMEOUT
        ) from exc
    except (OSError, http.client.HTTPException) as exc:
        connection_drop(key)
        raise ProviderError(
            f"connection broke while reading: {exc}", retryable=True, code=FailoverCode.CONNECTION_ERROR
        ) from exc
    if resp.will_close:
        connection_drop(key)
    return data


def status_error(target: Target, resp: http.client.HTTPResponse, data: bytes) -> ProviderError:
    """The error for an upstream 4xx/5xx: the status only. What the provider said is logged here
    and nowhere else: an upstream body may name internal hosts or echo another system's data,
    and this message reaches attempts, failover events, batch output and eval comments.

    A 429 or 503 may say how long to stay away (Retry-After, or OpenAI's and Azure's finer
    retry-after-ms): the router cools the deployment down for that long.
    """
    status = resp.status
    logger.warning(
        "provider %s answered HTTP %s: %s", target.slug, status, data[:2000].decode("utf-8", "replace")
    )
    retry_after = None
    if status in (429, 503):
        retry_after = retry_after_seconds(resp.getheader("Retry-After"))
        ms = resp.getheader("retry-after-ms")
        if ms:
            try:
                retry_after = max(0.0, float(ms) / 1000.0)
            except ValueError:
                pass
    return ProviderError(
        f"HTTP {status} from {target.slug}",
        retryable=classify_status(status),
        status_code=status,
        retry_after=retry_after,
    )


def _body(target: Target, request: InferenceInput, *, stream: bool) -> tuple[str, dict[str, Any]]:
    """The provider's request body: the client's own (`wire`) with only `model` and the stream
    flags set, or, for requests built in-process, one made from the typed fields.

    A stream always asks for usage (`stream_options.include_usage`): the ledger bills what the
    provider counted. The gateway drops the usage event again for a client that did not ask.
    """
    chat = isinstance(request, ChatRequest)
    path = "/chat/completions" if chat else "/completions"
    if request.wire is not None:
        body = dict(request.wire)
    else:
        body = {}
        if isinstance(request, ChatRequest):
            body["messages"] = [{"role": m.role, "content": m.content} for m in request.messages]
        else:
            body["prompt"] = request.prompt
        for name in ("max_tokens", "temperature", "top_p"):
            value = getattr(request, name)
            if value is not None:
                body[name] = value
        if request.stop:
            body["stop"] = list(request.stop)
        if request.n != 1:
            body["n"] = request.n
        body.update(request.extra)
    body["model"] = target.provider_model_id or target.slug
    if stream:
        body["stream"] = True
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    elif body.get("stream"):
        del body["stream"]
        body.pop("stream_options", None)
    return path, body


def _usage_counts(usage: dict[str, Any]) -> dict[str, int]:
    """Token counts of an OpenAI usage object, with the cached and reasoning details."""
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    return {
        "tokens_in": int(usage.get("prompt_tokens") or 0),
        "tokens_out": int(usage.get("completion_tokens") or 0),
        "cached_tokens": int(prompt_details.get("cached_tokens") or 0),
        "reasoning_tokens": int(completion_details.get("reasoning_tokens") or 0),
    }


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header as seconds: delta-seconds or an HTTP date (RFC 9110 §10.2.3)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _headers(target: Target) -> dict[str, str]:
    return {"Authorization": f"Bearer {target.credentials}"} if target.credentials else {}


def _text_of(choice: dict[str, Any], chat: bool) -> str:
    if chat:
        message = choice.get("message") or choice.get("delta") or {}
        return str(message.get("content") or "")
    return str(choice.get("text") or "")


class OpenAICompatibleAdapter:
    kind = "openai-compatible"

    def complete(self, target: Target, request: InferenceInput, *, timeout: float) -> Completion:
        path, body = _body(target, request, stream=False)
        resp, key = request_json(
            target.base_url,
            path,
            body,
            headers=_headers(target),
            timeout=timeout,
            allow_private=target.allow_private,
        )
        data = read_body(resp, key)
        if resp.status >= 300:  # a redirect is an answer here, never followed
            raise status_error(target, resp, data)
        try:
            doc = json.loads(data)
            choice = doc["choices"][0]
            if not isinstance(doc, dict) or not isinstance(choice, dict):
                raise TypeError("not an answer document")
            return Completion(
                text=_text_of(choice, isinstance(request, ChatRequest)),
                finish_reason=str(choice.get("finish_reason") or "stop"),
                provider_model=str(doc.get("model") or ""),
                status_code=resp.status,
                raw=doc,
                **_usage_counts(doc.get("usage") or {}),
            )
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            # A 200 with a body we cannot read: the provider is broken right now, so another
            # deployment may well answer (the chaos adapter's "malformed" drill). The body is
            # logged, never passed on (see status_error).
            logger.warning("malformed answer from %s: %r", target.slug, data[:2000])
            raise ProviderError(
                f"malformed answer from {target.slug}",
                retryable=True,
                status_code=resp.status,
                code=FailoverCode.MALFORMED_RESPONSE,
            ) from exc

    def embed(self, target: Target, request: EmbeddingRequest, *, timeout: float) -> Completion:
        body: dict[str, Any] = (
            dict(request.wire) if request.wire is not None else {"input": list(request.texts)}
        )
        body["model"] = target.provider_model_id or target.slug
        resp, key = request_json(
            target.base_url,
            "/embeddings",
            body,
            headers=_headers(target),
            timeout=timeout,
            allow_private=target.allow_private,
        )
        data = read_body(resp, key)
        if resp.status >= 300:  # a redirect is an answer here, never followed
            raise status_error(target, resp, data)
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or not isinstance(doc["data"], list):
                raise TypeError("not an embeddings document")
            usage = doc.get("usage") or {}
            return Completion(
                text="",
                tokens_in=int(usage.get("prompt_tokens") or 0),
                tokens_out=0,
                provider_model=str(doc.get("model") or ""),
                status_code=resp.status,
                raw=doc,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            logger.warning("malformed embeddings answer from %s: %r", target.slug, data[:2000])
            raise ProviderError(
                f"malformed embeddings answer from {target.slug}",
                retryable=True,
                status_code=resp.status,
                code=FailoverCode.MALFORMED_RESPONSE,
            ) from exc

    def stream(self, target: Target, request: InferenceInput, *, timeout: float) -> Iterator[StreamChunk]:
        path, body = _body(target, request, stream=True)
        headers = {**_headers(target), "Accept": "text/event-stream"}
        resp, key = request_json(
            target.base_url, path, body, headers=headers, timeout=timeout, allow_private=target.allow_private
        )
        if resp.status >= 300:
            raise status_error(target, resp, read_body(resp, key))
        return self._events(target, request, resp, key)

    def _events(
        self, target: Target, request: InferenceInput, resp: http.client.HTTPResponse, key: ConnKey
    ) -> Iterator[StreamChunk]:
        chat = isinstance(request, ChatRequest)
        finish: str | None = None
        try:
            while True:
                line = resp.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    # Read to the end so the kept-alive connection is reusable.
                    resp.read()
                    break
                try:
                    doc = json.loads(payload)
                except ValueError as exc:
                    raise ProviderError(
                        f"malformed stream event from {target.slug}",
                        retryable=True,
                        code=FailoverCode.MALFORMED_RESPONSE,
                    ) from exc
                if not isinstance(doc, dict):
                    raise ProviderError(
                        f"malformed stream event from {target.slug}",
                        retryable=True,
                        code=FailoverCode.MALFORMED_RESPONSE,
                    )
                # One chunk per event, the event itself in `raw`: the gateway passes it on whole.
                text, finish_now = "", None
                for choice in doc.get("choices") or []:
                    if not isinstance(choice, dict):
                        raise ProviderError(
                            f"malformed stream event from {target.slug}",
                            retryable=True,
                            code=FailoverCode.MALFORMED_RESPONSE,
                        )
                    if choice.get("index", 0) == 0:
                        text = _text_of(choice, chat)
                        finish_now = choice.get("finish_reason") or None
                    finish = choice.get("finish_reason") or finish
                usage = doc.get("usage")
                if isinstance(usage, dict) and usage:
                    yield StreamChunk(
                        text=text, finish_reason=finish or "stop", raw=doc, **_usage_counts(usage)
                    )
                else:
                    yield StreamChunk(text=text, finish_reason=finish_now, raw=doc)
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            connection_drop(key)
            code = FailoverCode.TIMEOUT if isinstance(exc, TimeoutError) else FailoverCode.CONNECTION_ERROR
            raise ProviderError(f"stream from {target.slug} broke: {exc}", retryable=True, code=code) from exc
        if resp.will_close:
            connection_drop(key)
