"""Where a /v1 call's CPU goes, stage by stage, and how many round trips it makes.

The same POST /v1/chat/completions as the gateway figures, through the WSGI application gunicorn
serves (stack.wsgi: the data plane), called in this process so that one thread does the whole
request. Two passes over the same requests:

- plain: the request thread's CPU per call (time.thread_time), and its round trips per call:
  SQL statements sent by the thread (a connection execute_wrapper), Redis round trips (each
  send on a redis-py connection: a pipeline or a script call is one) and upstream HTTP
  exchanges (http.client responses read);
- profiled: cProfile with the thread's CPU clock as its timer, each function's own CPU (not
  its callees') summed by the stage its module belongs to (STAGES, first match wins). The
  profiler's own cost inflates every function, so read the shares, and the plain pass for the
  total.

What the journal's folder thread does after the answer (the ledger rows) runs on another thread
and is not in these figures; `gateway_cpu_ms_per_request` (whole processes) counts it.
"""

from __future__ import annotations

import cProfile
import http.client
import json
import pstats
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils.module_loading import import_string
from redis.connection import AbstractConnection

from bench.gateway.client import BODY, v1_environ

# (stage, path fragments of the modules that make it), in request order; the first match wins.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "entry: data-plane handler and middleware",
        ("/stack/dataplane/", "/stack/wsgi.py", "/inference/gateway/middleware.py"),
    ),
    (
        "parse: body and request validation",
        ("/inference/gateway/openai_request.py", "/inference/gateway/openai_body.py"),
    ),
    ("principal: key, roles, team", ("/registry/auth/", "/registry/models/", "/registry/crypto.py")),
    (
        "admission: rate limits, budgets",
        ("/inference/ratelimit/", "/billing/budgets/", "/inference/admission.py"),
    ),
    (
        "plan: route, prices, breakers",
        (
            "/inference/router/policy.py",
            "/inference/router/context.py",
            "/inference/breaker/",
            "/inference/selectors.py",
            "/billing/prices",
        ),
    ),
    ("call: router, adapter, retries", ("/inference/router/", "/inference/adapters/", "/registry/outbound/")),
    ("journal: the durable row", ("/inference/recording/",)),
    (
        "view and respond: answer body, metrics, tracing",
        ("/inference/gateway/", "/inference/metrics.py", "/inference/tracing.py", "/registry/tracing.py"),
    ),
    ("other project code", ("/stack/", "/registry/", "/billing/", "/inference/")),
    ("Django (handler, request, ORM)", ("/django/",)),
    ("database driver (psycopg)", ("/psycopg",)),
    ("Redis client (redis-py)", ("/redis/",)),
    (
        "HTTP client and sockets (stdlib)",
        ("/http/client.py", "/socket.py", "/ssl.py", "<method 'recv", "<method 'send"),
    ),
    ("JSON (stdlib json, orjson)", ("/json/", "orjson")),
)
OTHER = "everything else (stdlib, builtins, prometheus, ...)"


def _call(app: Callable[..., Iterable[bytes]], token: str, body: bytes) -> None:
    status: list[str] = []
    answer = app(v1_environ(token, body), lambda s, h, e=None: status.append(s))
    b"".join(answer)
    getattr(answer, "close", lambda: None)()
    if not status or not status[0].startswith("200"):
        raise RuntimeError(f"bench request failed: {status}")


class _RoundTrips:
    """Counts this thread's SQL statements, Redis sends and upstream HTTP responses."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.counts: Counter[str] = Counter()

    @contextmanager
    def counting(self) -> Iterator[None]:
        counts, thread = self.counts, self.thread
        send = AbstractConnection.send_packed_command
        getresponse = http.client.HTTPConnection.getresponse

        def sql(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
            counts["sql"] += 1
            return execute(sql, params, many, context)

        def redis_send(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
            if threading.get_ident() == thread:
                counts["redis"] += 1
            send(self, command, check_health)

        def http_response(self: http.client.HTTPConnection) -> http.client.HTTPResponse:
            if threading.get_ident() == thread:
                counts["http"] += 1
            return getresponse(self)

        AbstractConnection.send_packed_command = redis_send  # type: ignore[method-assign]
        http.client.HTTPConnection.getresponse = http_response  # type: ignore[method-assign]
        try:
            with connection.execute_wrapper(sql):
                yield
        finally:
            AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
            http.client.HTTPConnection.getresponse = getresponse  # type: ignore[method-assign]


def _stage(filename: str, function: str) -> str:
    where = f"{filename}:{function}"
    for stage, fragments in STAGES:
        if any(fragment in where for fragment in fragments):
            return stage
    return OTHER


# The pipeline's own stages (STAGES up to "other project code"): a call into one of their modules
# opens that stage, and everything it calls (Django's ORM, redis-py, sockets, JSON) counts to it.
PIPELINE = tuple(stage for stage, _ in STAGES[: [s for s, _ in STAGES].index("other project code")])
OUTSIDE = "Django's request cycle and WSGI, outside the stages"


class _StageClock:
    """A sys.setprofile hook charging the thread's CPU between two events to the innermost open
    pipeline stage (callees included): where a stage's time goes, library calls and all."""

    def __init__(self) -> None:
        self.totals: defaultdict[str, float] = defaultdict(float)
        self.open: list[tuple[Any, str]] = []  # (frame, stage), innermost last
        self.last = time.thread_time()
        self.stage_of: dict[Any, str | None] = {}

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        now = time.thread_time()
        self.totals[self.open[-1][1] if self.open else OUTSIDE] += now - self.last
        if event == "call":
            code = frame.f_code
            if code not in self.stage_of:
                found = _stage(code.co_filename, code.co_name)
                self.stage_of[code] = found if found in PIPELINE else None
            opened = self.stage_of[code]
            if opened is not None and (not self.open or self.open[-1][1] != opened):
                self.open.append((frame, opened))
        elif event == "return" and self.open and self.open[-1][0] is frame:
            self.open.pop()
        self.last = time.thread_time()


def stage_profile(*, token: str, model: str, n: int, warmup: int, conn_max_age: int) -> dict[str, Any]:
    """The figures described in the module docstring, for `n` calls after `warmup`."""
    app = import_string(settings.WSGI_APPLICATION)
    body = json.dumps({**BODY, "model": model}).encode()
    kept = connection.settings_dict["CONN_MAX_AGE"]
    connection.close()
    connection.settings_dict["CONN_MAX_AGE"] = conn_max_age
    try:
        for _ in range(warmup):
            _call(app, token, body)
        trips = _RoundTrips()
        cpu: list[float] = []
        with trips.counting():
            for _ in range(n):
                started = time.thread_time()
                _call(app, token, body)
                cpu.append(time.thread_time() - started)
        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
        for _ in range(n):
            _call(app, token, body)
        profiler.disable()
        clock = _StageClock()
        sys.setprofile(clock)
        try:
            for _ in range(n):
                _call(app, token, body)
        finally:
            sys.setprofile(None)
    finally:
        connection.close()
        connection.settings_dict["CONN_MAX_AGE"] = kept
    by_code: defaultdict[str, float] = defaultdict(float)
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    for (filename, _line, function), (_cc, _nc, own, _cum, _callers) in stats.items():
        by_code[_stage(filename, function)] += own
    p50_us = statistics.median(cpu) * 1e6

    def shares(seconds: dict[str, float]) -> dict[str, float]:
        # Each part's share of a profiled pass, applied to the unprofiled p50: an estimate.
        total = sum(seconds.values()) or 1.0
        ordered = sorted(seconds.items(), key=lambda item: -item[1])
        return {part: round(own / total * p50_us, 1) for part, own in ordered}

    return {
        "profile_requests": n,
        "request_thread_cpu_p50_us": round(p50_us, 1),
        "round_trips_per_request": {
            kind: round(trips.counts[kind] / n, 2) for kind in ("sql", "redis", "http")
        },
        # By pipeline stage, everything a stage calls included (the _StageClock pass).
        "stage_cpu_us_estimated": shares(clock.totals),
        # By whose code ran (each function's own CPU, cProfile): Django, drivers, our modules.
        "code_cpu_us_estimated": shares(by_code),
    }
