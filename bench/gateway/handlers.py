"""What the pages' middleware chain would add to a /v1 call: the same POST /v1/chat/completions
through Django's full handler and through the data plane's (stack.dataplane), in this process,
alternated call by call so both see the same machine load; the figure is the median of the
per-pair differences (a loaded machine blurs a difference of two medians far more)."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterable

from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler
from django.db import connection
from django.utils.module_loading import import_string

from bench.gateway.client import BODY, v1_environ


def _timed(handler: Callable[..., Iterable[bytes]], token: str, body: bytes) -> float:
    status: list[str] = []
    started = time.perf_counter()
    answer = handler(v1_environ(token, body), lambda s, h, e=None: status.append(s))
    b"".join(answer)
    getattr(answer, "close", lambda: None)()
    elapsed = time.perf_counter() - started
    if not status or not status[0].startswith("200"):
        raise RuntimeError(f"bench request failed: {status}")
    return elapsed


def middleware_saved(*, token: str, model: str, n: int, warmup: int, conn_max_age: int) -> dict[str, float]:
    """p50 of each handler and the paired p50 of (full chain - data plane), in ms; the database
    connection kept between requests for `conn_max_age` seconds, as the web server keeps it."""
    kept = connection.settings_dict["CONN_MAX_AGE"]
    connection.close()
    connection.settings_dict["CONN_MAX_AGE"] = conn_max_age
    try:
        return _pairs(token=token, model=model, n=n, warmup=warmup)
    finally:
        connection.close()
        connection.settings_dict["CONN_MAX_AGE"] = kept


def _pairs(*, token: str, model: str, n: int, warmup: int) -> dict[str, float]:
    # What gunicorn serves (settings.WSGI_APPLICATION: /v1 takes the data plane), read by name as
    # gunicorn reads it, and Django's own handler with every settings.MIDDLEWARE entry.
    data_plane = import_string(settings.WSGI_APPLICATION)
    pages = WSGIHandler()
    body = json.dumps({**BODY, "model": model}).encode()
    for _ in range(warmup):
        _timed(pages, token, body)
        _timed(data_plane, token, body)
    full, plane = [], []
    for _ in range(n):
        full.append(_timed(pages, token, body))
        plane.append(_timed(data_plane, token, body))
    return {
        "handler_full_chain_p50_ms": statistics.median(full) * 1000,
        "handler_data_plane_p50_ms": statistics.median(plane) * 1000,
        "middleware_saved_paired_p50_ms": statistics.median(a - b for a, b in zip(full, plane, strict=True))
        * 1000,
    }
