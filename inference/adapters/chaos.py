"""Fault injection around any adapter, for failover drills (inference.models.ChaosConfig).

The config travels in the Target (`extra["chaos"]`), a snapshot the router refreshes whenever a
ChaosConfig is saved, so switching chaos on in the UI or API takes effect on the next request.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

from inference.adapters.base import (
    Adapter,
    Completion,
    EmbeddingRequest,
    InferenceInput,
    ProviderError,
    StreamChunk,
    Target,
    classify_status,
)
from registry.failover_codes import FailoverCode

_rng = random.Random()  # noqa: S311 (fault injection, not security)


class ChaosAdapter:
    kind = "chaos"

    def __init__(self, inner: Adapter) -> None:
        self.inner = inner

    def _inject(self, target: Target, timeout: float) -> None:
        cfg: dict[str, Any] = target.extra.get("chaos") or {}
        latency = float(cfg.get("latency_ms") or 0) / 1000.0
        if latency > 0:
            if latency >= timeout:
                time.sleep(max(timeout, 0.0))
                raise ProviderError(
                    f"chaos: {target.slug} timed out (latency {latency * 1000:.0f} ms)",
                    retryable=True,
                    code=FailoverCode.TIMEOUT,
                )
            time.sleep(latency)
        if _rng.random() < float(cfg.get("error_rate") or 0.0):
            codes = [int(c) for c in cfg.get("status_codes") or []] or [503]
            status = _rng.choice(codes)
            raise ProviderError(
                f"chaos: injected HTTP {status} from {target.slug}",
                retryable=classify_status(status),
                status_code=status,
            )
        if _rng.random() < float(cfg.get("malformed_rate") or 0.0):
            raise ProviderError(
                f"chaos: malformed answer from {target.slug}",
                retryable=True,
                status_code=200,
                code=FailoverCode.MALFORMED_RESPONSE,
            )

    def complete(self, target: Target, request: InferenceInput, *, timeout: float) -> Completion:
        started = time.perf_counter()
        self._inject(target, timeout)
        return self.inner.complete(
            target, request, timeout=max(0.05, timeout - (time.perf_counter() - started))
        )

    def embed(self, target: Target, request: EmbeddingRequest, *, timeout: float) -> Completion:
        started = time.perf_counter()
        self._inject(target, timeout)
        return self.inner.embed(target, request, timeout=max(0.05, timeout - (time.perf_counter() - started)))

    def stream(self, target: Target, request: InferenceInput, *, timeout: float) -> Iterator[StreamChunk]:
        started = time.perf_counter()
        self._inject(target, timeout)
        return self.inner.stream(
            target, request, timeout=max(0.05, timeout - (time.perf_counter() - started))
        )
