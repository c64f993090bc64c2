"""What the router's Prometheus metrics cost per request, in process and through the gateway
(prometheus-client's multiprocess files, as the shipped gunicorn configuration writes them)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from django.conf import settings

from bench.gateway.client import Client, measure, percentiles
from inference.adapters.base import ChatRequest
from inference.metrics import route_observe
from inference.router.entry import route


def gateway_metrics_cost(
    on_port: int, off_port: int, auth: dict[str, str], body: dict[str, Any], *, n: int, warmup: int
) -> dict[str, float]:
    """The gateway with the router's metrics on (prometheus-client's multiprocess files, as in
    production) and off (SWITCHYARD_METRICS=false), request by request on two servers of the
    same configuration, each going first in turn: both see the same machine load."""
    on = Client(on_port, "/v1/chat/completions", auth)
    off = Client(off_port, "/v1/chat/completions", auth)
    on_samples: list[float] = []
    off_samples: list[float] = []
    for i in range(warmup + n):
        pairs = [(on, on_samples), (off, off_samples)]
        for client, samples in pairs if i % 2 else reversed(pairs):
            t0 = time.perf_counter()
            status, doc = client.post(body)
            if status != 200:
                raise RuntimeError(f"gateway answered {status}: {doc}")
            if i >= warmup:
                samples.append(time.perf_counter() - t0)
    on_p50, _ = percentiles(on_samples)
    off_p50, _ = percentiles(off_samples)
    return {
        "gateway_metrics_on_p50_ms": on_p50,
        "gateway_metrics_off_p50_ms": off_p50,
        "metrics_added_p50_ms": on_p50 - off_p50,
    }


def observe_cost(*, n: int, warmup: int) -> float:
    """p50 ms of inference.metrics.route_observe alone for a failover (two attempts, one answered),
    with whatever value storage this process's prometheus-client chose when it was imported."""
    from types import SimpleNamespace

    attempts: Any = [
        SimpleNamespace(entry=SimpleNamespace(slug="bench-a"), outcome="retryable", latency_ms=1.0),
        SimpleNamespace(
            entry=SimpleNamespace(slug="bench-b"), outcome="ok", latency_ms=1.0, tokens_in=10, tokens_out=5
        ),
    ]

    def observe() -> None:
        route_observe(workflow="bench", deployment="bench-b", ok=True, latency_ms=2.0, attempts=attempts)

    p50, _ = measure(observe, n=n, warmup=warmup)
    return p50


def _observe_cost_multiprocess(*, n: int, warmup: int) -> float:
    """observe_cost in a child process whose prometheus-client writes gunicorn's mmapped files
    (PROMETHEUS_MULTIPROC_DIR set before it is imported), as a web worker's does."""
    with tempfile.TemporaryDirectory() as directory:
        code = (
            "import django; django.setup()\n"
            "from prometheus_client import values\n"
            "assert 'Mmap' in values.ValueClass.__name__, values.ValueClass\n"
            "from bench.gateway.metrics_cost import observe_cost\n"
            f"print(observe_cost(n={n}, warmup={warmup}))\n"
        )
        env = {
            **os.environ,
            "PROMETHEUS_MULTIPROC_DIR": directory,
            "DJANGO_SETTINGS_MODULE": "stack.settings",
        }
        done = subprocess.run(  # noqa: S603 (our interpreter, our code)
            [sys.executable, "-c", code],
            env=env,
            cwd=str(Path(settings.BASE_DIR)),
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        return float(done.stdout.strip().splitlines()[-1])


def router_metrics_cost(workflow: Any, ping: ChatRequest, *, n: int, warmup: int) -> dict[str, float]:
    """In this process: route() with the metrics on and off, alternated; and inference.metrics'
    route_observe alone, with in-process values and with gunicorn's mmapped files."""
    on_samples: list[float] = []
    off_samples: list[float] = []
    try:
        for i in range(warmup + n):
            for enabled, samples in (
                ((True, on_samples), (False, off_samples))
                if i % 2
                else (
                    (False, off_samples),
                    (True, on_samples),
                )
            ):
                settings.METRICS_ENABLED = enabled
                t0 = time.perf_counter()
                route(workflow=workflow, request=ping)
                if i >= warmup:
                    samples.append(time.perf_counter() - t0)
    finally:
        settings.METRICS_ENABLED = True
    on_p50, _ = percentiles(on_samples)
    off_p50, _ = percentiles(off_samples)
    return {
        "router_metrics_added_p50_ms": on_p50 - off_p50,
        "metrics_observe_p50_ms": observe_cost(n=n, warmup=warmup),
        "metrics_observe_multiprocess_p50_ms": _observe_cost_multiprocess(n=n, warmup=warmup),
    }
