"""The breakers a process uses: in Redis when REDIS_URL is set (inference.breaker.redis_breakers),
else in-process under a lock (LocalBreakers, the same logic for the embedded demo); a success
is recorded off the request thread; `breaker_state` for pages and the API."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.conf import settings

from inference.breaker.redis_breakers import RedisBreakers
from inference.breaker.state import CLOSED, HALF_OPEN, LATENCY_SAMPLES, OPEN, monotonic_now
from inference.router.policy import Peek

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from inference.breaker.state import BreakerSettings


class LocalBreakers:
    """The same breakers in one process, for the embedded demo without Redis."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: dict[int, dict[str, Any]] = {}
        self._lat: dict[int, deque[float]] = {}
        self._once: dict[str, float] = {}

    def _h(self, deployment_id: int) -> dict[str, Any]:
        return self._state.setdefault(deployment_id, {"state": CLOSED})

    def peek(self, deployment_ids: Sequence[int], *, now: float, cfg: BreakerSettings) -> list[Peek]:
        out = []
        with self._lock:
            for d in deployment_ids:
                h = self._h(d)
                if now < h.get("cool", 0.0):
                    out.append(Peek.OPEN)
                    continue
                if h["state"] == CLOSED:
                    out.append(Peek.CLOSED)
                    continue
                since = h["opened"] if h["state"] == OPEN else h.get("probe", 0.0)
                out.append(Peek.HALF_OPEN if now - since >= cfg.cooldown_s else Peek.OPEN)
        return out

    def claim_probe(self, deployment_id: int, *, now: float, cfg: BreakerSettings) -> bool:
        with self._lock:
            h = self._h(deployment_id)
            if h["state"] == CLOSED:
                return True
            if h["state"] == OPEN and now - h["opened"] >= cfg.cooldown_s:
                h["state"], h["probe"] = HALF_OPEN, now
                return True
            if h["state"] == HALF_OPEN and now - h.get("probe", 0.0) >= cfg.cooldown_s:
                h["probe"] = now
                return True
            return False

    def record(
        self, deployment_id: int, *, ok: bool, latency_ms: float, now: float, cfg: BreakerSettings
    ) -> tuple[str, str]:
        with self._lock:
            if ok:
                self._lat.setdefault(deployment_id, deque(maxlen=LATENCY_SAMPLES)).appendleft(latency_ms)
            h = self._h(deployment_id)
            calls: deque[tuple[bool, float]] = h.setdefault("calls", deque())
            if h["state"] == HALF_OPEN:
                calls.clear()
                if ok:
                    h["state"] = CLOSED
                    return CLOSED, "closed"
                h.update(state=OPEN, opened=now)
                return OPEN, "opened"
            if h["state"] == OPEN:
                return OPEN, ""
            calls.appendleft((ok, now))
            while len(calls) > cfg.window_calls:
                calls.pop()
            recent = [good for good, at in calls if now - at <= cfg.window_s]
            failures = sum(1 for good in recent if not good)
            if len(recent) >= cfg.min_requests and failures / len(recent) >= cfg.failure_rate:
                h.update(state=OPEN, opened=now)
                calls.clear()
                return OPEN, "opened"
            return CLOSED, ""

    def cool_down(self, deployment_id: int, *, until: float) -> None:
        with self._lock:
            h = self._h(deployment_id)
            h["cool"] = max(until, h.get("cool", 0.0))

    def cooling(self, deployment_ids: Sequence[int], *, now: float) -> dict[int, float]:
        with self._lock:
            cools = {d: self._h(d).get("cool", 0.0) for d in deployment_ids}
        return {d: until - now for d, until in cools.items() if until > now}

    def state(self, deployment_id: int) -> dict[str, str]:
        with self._lock:
            return {k: str(v) for k, v in self._h(deployment_id).items()}

    def states(self, deployment_ids: Sequence[int]) -> dict[int, str]:
        with self._lock:
            return {d: str(self._state.get(d, {}).get("state", CLOSED)) for d in deployment_ids}

    def latencies(self, deployment_ids: Sequence[int]) -> dict[int, list[float]]:
        with self._lock:
            return {d: list(self._lat.get(d, ())) for d in deployment_ids}

    def claim_once(self, key: str, *, ttl_s: float) -> bool:
        now = time.monotonic()
        with self._lock:
            if self._once.get(key, 0.0) > now:
                return False
            self._once[key] = now + ttl_s
            return True


Breakers = RedisBreakers | LocalBreakers
_breakers: Breakers | None = None
_breakers_lock = threading.Lock()


def breakers() -> Breakers:
    """The process's breaker store: Redis when REDIS_URL is set, else in-process."""
    global _breakers
    if _breakers is None:
        with _breakers_lock:
            if _breakers is None:
                url = settings.REDIS_URL
                _breakers = RedisBreakers(url) if url else LocalBreakers()
    return _breakers


class _SuccessRecorder:
    """Records ordinary successes off the request path (a Redis round trip each).

    A success only moves a closed breaker's window and the latency samples, which nothing reads
    synchronously; failures and half-open probe results are recorded at once by the router, so
    a circuit still opens and closes on the request that decides it.
    """

    def __init__(self, store: RedisBreakers) -> None:
        self.store = store
        self.queue: queue.SimpleQueue[tuple[int, float, float, BreakerSettings]] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.pid = 0
        self._lock = threading.Lock()

    def put(self, deployment_id: int, latency_ms: float, now: float, cfg: BreakerSettings) -> None:
        if self.thread is None or self.pid != os.getpid():  # first use, or a forked worker
            with self._lock:
                if self.thread is None or self.pid != os.getpid():
                    self.queue = queue.SimpleQueue()
                    self.pid = os.getpid()
                    self.thread = threading.Thread(target=self._run, name="breaker-successes", daemon=True)
                    self.thread.start()
        self.queue.put((deployment_id, latency_ms, now, cfg))

    def _run(self) -> None:
        q = self.queue
        while True:
            deployment_id, latency_ms, now, cfg = q.get()
            try:
                _, transition = self.store.record(
                    deployment_id, ok=True, latency_ms=latency_ms, now=now, cfg=cfg
                )
                if transition:
                    # Rare: a call begun before the circuit opened answered while it was half
                    # open. No request carries this transition, so this thread records it.
                    from inference.recording.fold import breaker_transition_record  # noqa: PLC0415 (ORM)

                    breaker_transition_record(deployment_id=deployment_id, transition=transition, cause="")
            except Exception:  # noqa: BLE001 (a lost sample must not kill the recorder)
                logger.warning("could not record a success for deployment %s", deployment_id, exc_info=True)


_recorder: _SuccessRecorder | None = None


def record_success(deployment_id: int, *, latency_ms: float, probe: bool, cfg: BreakerSettings) -> str:
    """Count a successful call: at once for a half-open probe (it closes the circuit), in the
    background otherwise (see _SuccessRecorder). Returns the transition it caused ("closed"),
    or "" (always "" in the background: the recorder thread records its own)."""
    global _recorder
    store = breakers()
    now = monotonic_now()
    if probe or not isinstance(store, RedisBreakers):
        _, transition = store.record(deployment_id, ok=True, latency_ms=latency_ms, now=now, cfg=cfg)
        return transition
    if _recorder is None or _recorder.store is not store:
        _recorder = _SuccessRecorder(store)
    _recorder.put(deployment_id, latency_ms, now, cfg)
    return ""


def breaker_state(deployment_id: int) -> str:
    """closed / open / half_open, for pages and the API."""
    return breakers().state(deployment_id).get("state", CLOSED)
