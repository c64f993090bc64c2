"""The HTTP client every HTTP adapter uses (OpenAI-compatible, OpenAI's Responses, Anthropic).

http.client with one keep-alive connection per (thread, host): measured on the bench's loopback
mock it adds well under 0.1 ms per call, where urllib3's PoolManager adds a few tenths of a
millisecond of bookkeeping. A connection the server closed while idle is detected on the next use
and reopened once (the request had not been processed: the server closed before reading it).

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
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from inference.adapters.base import ProviderError, StreamChunk, Target, classify_status
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
                pass  # not a number: Retry-After's figure, if any, stands
    return ProviderError(
        f"HTTP {status} from {target.slug}",
        retryable=classify_status(status),
        status_code=status,
        retry_after=retry_after,
    )


def malformed_answer(target: Target, status: int, data: bytes, what: str = "answer") -> ProviderError:
    """A 2xx whose body cannot be read: the provider is broken right now, so another deployment
    may well answer (the chaos adapter's "malformed" drill). The body is logged, never passed on
    (see status_error)."""
    logger.warning("malformed %s from %s: %r", what, target.slug, data[:2000])
    return ProviderError(
        f"malformed {what} from {target.slug}",
        retryable=True,
        status_code=status,
        code=FailoverCode.MALFORMED_RESPONSE,
    )


def call_json(
    target: Target, path: str, body: dict[str, Any], *, headers: dict[str, str], timeout: float
) -> tuple[http.client.HTTPResponse, bytes]:
    """POST `body` to the target's `path` and read the whole answer; an answer other than 2xx
    (a redirect included: never followed) is status_error's ProviderError."""
    resp, key = request_json(
        target.base_url, path, body, headers=headers, timeout=timeout, allow_private=target.allow_private
    )
    data = read_body(resp, key)
    if resp.status >= 300:
        raise status_error(target, resp, data)
    return resp, data


def open_stream(
    target: Target, path: str, body: dict[str, Any], *, headers: dict[str, str], timeout: float
) -> tuple[http.client.HTTPResponse, ConnKey]:
    """POST `body` asking for a stream: the open 2xx response to read (sse_chunks), else
    status_error's ProviderError."""
    resp, key = request_json(
        target.base_url,
        path,
        body,
        headers={**headers, "Accept": "text/event-stream"},
        timeout=timeout,
        allow_private=target.allow_private,
    )
    if resp.status >= 300:
        raise status_error(target, resp, read_body(resp, key))
    return resp, key


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header as seconds: delta-seconds or an HTTP date (RFC 9110 §10.2.3)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass  # not delta-seconds: an HTTP date, next
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


StreamMapper = Callable[[dict[str, Any]], list[StreamChunk]]


def sse_chunks(
    target: Target, resp: http.client.HTTPResponse, key: ConnKey, mapper: StreamMapper
) -> Iterator[StreamChunk]:
    """A server-sent event stream read as it arrives: each `data:` line's JSON object given to
    `mapper`, whose chunks are yielded (OpenAI's `[DONE]` ends it; `event:` lines are not read,
    every format here repeats the event's type in its data). A line that is not a JSON object,
    or an event the mapper cannot read, is a malformed answer; a ProviderError the mapper raises
    (the provider's own error event) fails the call. A stream not read to its end (an error, or
    a caller that stopped reading: the client went away) has its connection dropped, never
    reused with unread data on it, which would fail the thread's next call to that host. The
    connection is the one this thread opened (a generator may be closed on another thread)."""
    conns = _connections()
    conn = conns.get(key)
    ended = False
    try:
        while True:
            line = resp.readline()
            if not line:
                ended = True
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                resp.read()  # to the end, so the kept-alive connection is reusable
                ended = True
                break
            try:
                doc = json.loads(payload)
                if not isinstance(doc, dict):
                    raise TypeError("a stream event is not a JSON object")
                chunks = mapper(doc)
            except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
                raise ProviderError(
                    f"malformed stream event from {target.slug}",
                    retryable=True,
                    code=FailoverCode.MALFORMED_RESPONSE,
                ) from exc
            yield from chunks
    except (TimeoutError, OSError, http.client.HTTPException) as exc:
        code = FailoverCode.TIMEOUT if isinstance(exc, TimeoutError) else FailoverCode.CONNECTION_ERROR
        raise ProviderError(f"stream from {target.slug} broke: {exc}", retryable=True, code=code) from exc
    finally:
        if not ended or resp.will_close:
            if conn is not None and conns.get(key) is conn:
                conns.pop(key, None)
            if conn is not None:
                conn.close()
