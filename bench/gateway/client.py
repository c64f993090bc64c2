"""The bench's HTTP client on a kept-alive connection, the request body it sends, and how it
times a call (warm-up, then p50 and p99 of n samples)."""

from __future__ import annotations

import http.client
import io
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

BODY = {"model": "m", "messages": [{"role": "user", "content": "ping"}], "max_tokens": 8}


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return p50 * 1000.0, p95 * 1000.0


def quantile_ms(samples: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of samples in seconds, in ms."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000.0


def measure_samples(call: Callable[[], Any], *, n: int, warmup: int) -> list[float]:
    """Each call's wall time in seconds, `n` of them after `warmup` unrecorded ones."""
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return samples


def measure(call: Callable[[], Any], *, n: int, warmup: int) -> tuple[float, float]:
    return percentiles(measure_samples(call, n=n, warmup=warmup))


class Client:
    """A keep-alive JSON client (what any caller of a provider or of the gateway would use)."""

    def __init__(self, port: int, path: str, headers: dict[str, str] | None = None) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.path = path
        self.headers = {"Content-Type": "application/json", **(headers or {})}

    def post(self, body: dict[str, Any]) -> tuple[int, Any]:
        for attempt in range(2):
            try:
                self.conn.request("POST", self.path, json.dumps(body), self.headers)
                response = self.conn.getresponse()
                data = response.read()
                return response.status, json.loads(data)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.conn.close()
                if attempt:
                    raise
        raise RuntimeError("unreachable")

    def first_byte(self, body: dict[str, Any]) -> float:
        """Seconds from sending a streamed request to its first `data:` event with content
        (the time to first byte a chat client shows), then reads the stream to its end."""
        started = time.perf_counter()
        self.conn.request("POST", self.path, json.dumps({**body, "stream": True}), self.headers)
        response = self.conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"stream answered {response.status}: {response.read()[:200]!r}")
        first = None
        while line := response.readline():
            if first is None and line.startswith(b"data:") and b'"content"' in line:
                first = time.perf_counter() - started
        if first is None:
            raise RuntimeError("the stream carried no content event")
        return first


def v1_environ(token: str, body: bytes) -> dict[str, Any]:
    """The WSGI environ of POST /v1/chat/completions with `body` and a bearer `token`, as
    gunicorn's gthread workers hand it to the application (for calls made in this process)."""
    return {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/v1/chat/completions",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "80",
        "HTTP_HOST": "127.0.0.1",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_AUTHORIZATION": f"Bearer {token}",
        "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http",
        "wsgi.errors": io.StringIO(),
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
        "wsgi.version": (1, 0),
    }
