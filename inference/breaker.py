"""Circuit breakers per deployment, shared by every web process through Redis.

A breaker is closed until, over its sliding window (the last `window_calls` calls no older than
`window_s`), at least `min_requests` calls were made and the failure rate reached
`failure_rate`; it then opens for `cooldown_s`. After the cooldown one
caller claims the half-open probe; the probe's success closes the breaker (counters reset), its
failure opens it again for another cooldown. A probe that never reports (its process died) is
given up after another cooldown and a new one is claimed.

The state lives in one Redis hash per deployment, changed only by two Lua scripts, so every
transition is atomic across processes. Without REDIS_URL (the embedded demo) the same logic runs
in-process under a lock.

Each call also pushes its latency onto a capped list, from which `fastest` reads rolling p50s.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from inference.routing import Peek

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

LATENCY_SAMPLES = 200
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BreakerSettings:
    failure_rate: float = 0.5
    min_requests: int = 5
    window_calls: int = 20
    window_s: float = 60.0
    cooldown_s: float = 10.0


def breaker_settings() -> BreakerSettings:
    return BreakerSettings(
        failure_rate=float(getattr(settings, "INFERENCE_BREAKER_FAILURE_RATE", 0.5)),
        min_requests=int(getattr(settings, "INFERENCE_BREAKER_MIN_REQUESTS", 5)),
        window_calls=int(getattr(settings, "INFERENCE_BREAKER_WINDOW_CALLS", 20)),
        window_s=float(getattr(settings, "INFERENCE_BREAKER_WINDOW_SECONDS", 60.0)),
        cooldown_s=float(getattr(settings, "INFERENCE_BREAKER_COOLDOWN_SECONDS", 10.0)),
    )


# What a peek answers for one breaker hash, as a Lua function shared by the two peek scripts.
# The numbers are inference.routing.Peek's, named here from the enum itself.
_PEEK_ONE = f"""
local OPEN, CLOSED, HALF_OPEN = {Peek.OPEN:d}, {Peek.CLOSED:d}, {Peek.HALF_OPEN:d}  -- inference.routing.Peek
local function peek(key, now, cooldown)
  local h = redis.call('HMGET', key, 'state', 'opened', 'probe', 'cool')
  if h[4] and now < tonumber(h[4]) then return OPEN end  -- the provider's Retry-After
  local state = h[1]
  if not state or state == 'closed' then return CLOSED end
  local since = h[3] or '0'  -- half_open: when its probe was claimed
  if state == 'open' then since = h[2] end  -- open: when it opened
  if now - tonumber(since) >= cooldown then return HALF_OPEN end
  return OPEN
end
"""

# KEYS: breaker hash per candidate. ARGV: now, cooldown. Read-only: a Peek per breaker.
_PEEK = (
    _PEEK_ONE
    + """
local out = {}
local now = tonumber(ARGV[1]); local cooldown = tonumber(ARGV[2])
for i, key in ipairs(KEYS) do out[i] = peek(key, now, cooldown) end
return out
"""
)

# The same, with the route-cache generation first: KEYS[1] is the generation key, the breakers
# follow; returns {generation, Peek per breaker}.
_PEEK_GEN = (
    _PEEK_ONE
    + """
local out = {tonumber(redis.call('GET', KEYS[1]) or '0')}
local now = tonumber(ARGV[1]); local cooldown = tonumber(ARGV[2])
for i = 2, #KEYS do out[i] = peek(KEYS[i], now, cooldown) end
return out
"""
)

# KEYS[1]: breaker hash. ARGV: now, cooldown. Claims the half-open probe: 1 when this caller got it.
_CLAIM = """
local h = redis.call('HMGET', KEYS[1], 'state', 'opened', 'probe')
local now = tonumber(ARGV[1]); local cooldown = tonumber(ARGV[2])
if h[1] == 'open' and now - tonumber(h[2]) >= cooldown then
  redis.call('HSET', KEYS[1], 'state', 'half_open', 'probe', ARGV[1]); return 1
end
if h[1] == 'half_open' and now - tonumber(h[3] or '0') >= cooldown then
  redis.call('HSET', KEYS[1], 'probe', ARGV[1]); return 1
end
if not h[1] or h[1] == 'closed' then return 1 end
return 0
"""

# KEYS[1]: breaker hash, KEYS[2]: latency list, KEYS[3]: outcome list. ARGV: now, ok (1/0),
# latency_ms, window_s, min_requests, failure_rate, samples, window_calls. Returns
# {state, transition} where transition is '' or 'opened' / 'closed'.
# The failure rate is over a sliding window of the last `window_calls` calls that are at most
# `window_s` old (a count-based window, as in resilience4j's CircuitBreaker; the age limit keeps
# a failure from an hour ago from counting).
_RECORD = """
local key = KEYS[1]
local now = tonumber(ARGV[1]); local ok = ARGV[2] == '1'
local window = tonumber(ARGV[4]); local minreq = tonumber(ARGV[5]); local rate = tonumber(ARGV[6])
if ok then
  redis.call('LPUSH', KEYS[2], ARGV[3]); redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[7]) - 1)
end
local state = redis.call('HGET', key, 'state') or 'closed'
if state == 'half_open' then
  redis.call('DEL', KEYS[3])
  if ok then
    redis.call('HSET', key, 'state', 'closed')
    return {'closed', 'closed'}
  end
  redis.call('HSET', key, 'state', 'open', 'opened', ARGV[1])
  return {'open', 'opened'}
end
if state == 'open' then return {'open', ''} end
redis.call('LPUSH', KEYS[3], (ok and '1:' or '0:') .. ARGV[1])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[8]) - 1)
local n = 0; local f = 0
for _, item in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  if now - tonumber(string.sub(item, 3)) <= window then
    n = n + 1
    if string.sub(item, 1, 1) == '0' then f = f + 1 end
  end
end
if n >= minreq and f / n >= rate then
  redis.call('HSET', key, 'state', 'open', 'opened', ARGV[1])
  redis.call('DEL', KEYS[3])
  return {'open', 'opened'}
end
if state ~= 'closed' then redis.call('HSET', key, 'state', 'closed') end
return {'closed', ''}
"""


# KEYS[1]: breaker hash. ARGV[1]: until. Sets 'cool' unless it already ends later.
_COOL = """
local old = tonumber(redis.call('HGET', KEYS[1], 'cool') or '0')
if tonumber(ARGV[1]) > old then redis.call('HSET', KEYS[1], 'cool', ARGV[1]) end
return 1
"""


def _key(deployment_id: int) -> str:
    return f"sy:cb:{deployment_id}"


def _lat_key(deployment_id: int) -> str:
    return f"sy:lat:{deployment_id}"


def _calls_key(deployment_id: int) -> str:
    return f"sy:cbw:{deployment_id}"


class RedisBreakers:
    """Breakers whose state every process shares (REDIS_URL)."""

    def __init__(self, url: str) -> None:
        import redis  # only with REDIS_URL (the embedded demo runs without it)

        self.redis = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        # Redis unreachable (restarting, say): the breakers fail open instead of failing the
        # request. Every circuit reads closed and nothing is recorded until it answers again.
        self.down_errors = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
        self._peek = self.redis.register_script(_PEEK)
        self._peek_gen = self.redis.register_script(_PEEK_GEN)
        self._claim = self.redis.register_script(_CLAIM)
        self._record = self.redis.register_script(_RECORD)
        self._cool = self.redis.register_script(_COOL)

    def peek(self, deployment_ids: Sequence[int], *, now: float, cfg: BreakerSettings) -> list[Peek]:
        try:
            out = self._peek(keys=[_key(d) for d in deployment_ids], args=[now, cfg.cooldown_s])
        except self.down_errors:
            redis_unreachable("peek")
            return [Peek.CLOSED] * len(deployment_ids)
        return [Peek(int(x)) for x in out]

    def peek_with_generation(
        self, generation_key: str, deployment_ids: Sequence[int], *, now: float, cfg: BreakerSettings
    ) -> tuple[int, list[Peek]]:
        """(route-cache generation, peek per breaker) in one round trip."""
        keys = [generation_key, *(_key(d) for d in deployment_ids)]
        try:
            out = [int(x) for x in self._peek_gen(keys=keys, args=[now, cfg.cooldown_s])]
        except self.down_errors:
            redis_unreachable("peek")
            return GENERATION_UNKNOWN, [Peek.CLOSED] * len(deployment_ids)
        return out[0], [Peek(x) for x in out[1:]]

    def claim_probe(self, deployment_id: int, *, now: float, cfg: BreakerSettings) -> bool:
        try:
            return bool(self._claim(keys=[_key(deployment_id)], args=[now, cfg.cooldown_s]))
        except self.down_errors:
            redis_unreachable("claim a probe")
            return False

    def record(
        self, deployment_id: int, *, ok: bool, latency_ms: float, now: float, cfg: BreakerSettings
    ) -> tuple[str, str]:
        try:
            state, transition = self._record(
                keys=[_key(deployment_id), _lat_key(deployment_id), _calls_key(deployment_id)],
                args=[
                    f"{now:.6f}",
                    1 if ok else 0,
                    f"{latency_ms:.3f}",
                    cfg.window_s,
                    cfg.min_requests,
                    cfg.failure_rate,
                    LATENCY_SAMPLES,
                    cfg.window_calls,
                ],
            )
        except self.down_errors:
            redis_unreachable("record a call")
            return CLOSED, ""
        return _s(state), _s(transition)

    def cool_down(self, deployment_id: int, *, until: float) -> None:
        """Skip the deployment until `until` (a 429's Retry-After), whatever its circuit says."""
        try:
            # Only ever moves later: two 429s answered at once keep the longer wait.
            self._cool(keys=[_key(deployment_id)], args=[f"{until:.6f}"])
        except self.down_errors:
            redis_unreachable("cool a deployment down")

    def cooling(self, deployment_ids: Sequence[int], *, now: float) -> dict[int, float]:
        """Seconds left of each cooling deployment's wait (the failure path only)."""
        pipe = self.redis.pipeline(transaction=False)
        for d in deployment_ids:
            pipe.hget(_key(d), "cool")
        try:
            values = pipe.execute()
        except self.down_errors:
            redis_unreachable("read cooldowns")
            return {}
        return {
            d: float(v) - now for d, v in zip(deployment_ids, values, strict=True) if v and float(v) > now
        }

    def state(self, deployment_id: int) -> dict[str, str]:
        try:
            raw = self.redis.hgetall(_key(deployment_id))
        except self.down_errors:
            redis_unreachable("read a breaker")
            return {}
        return {_s(k): _s(v) for k, v in raw.items()}

    def states(self, deployment_ids: Sequence[int]) -> dict[int, str]:
        """closed / open / half_open per deployment, in one round trip (for /metrics)."""
        pipe = self.redis.pipeline(transaction=False)
        for d in deployment_ids:
            pipe.hget(_key(d), "state")
        try:
            values = pipe.execute()
        except self.down_errors:
            redis_unreachable("read breakers")
            return {}
        return {d: _s(v) if v else CLOSED for d, v in zip(deployment_ids, values, strict=True)}

    def latencies(self, deployment_ids: Sequence[int]) -> dict[int, list[float]]:
        pipe = self.redis.pipeline(transaction=False)
        for d in deployment_ids:
            pipe.lrange(_lat_key(d), 0, -1)
        try:
            rows = pipe.execute()
        except self.down_errors:
            redis_unreachable("read latencies")
            return {d: [] for d in deployment_ids}
        return {d: [float(x) for x in values] for d, values in zip(deployment_ids, rows, strict=True)}

    def claim_once(self, key: str, *, ttl_s: float) -> bool:
        """True for the first caller within ttl_s (e.g. one demotion event per episode); False
        while Redis is unreachable (better one event missed than one per request)."""
        try:
            return bool(self.redis.set(f"sy:once:{key}", b"1", nx=True, px=int(ttl_s * 1000)))
        except self.down_errors:
            redis_unreachable("claim an event")
            return False


# The route-cache generation while Redis is unreachable: no plan is current against it, so each
# request rebuilds its plan from the database (three queries) until Redis answers again.
GENERATION_UNKNOWN = -1
_last_unreachable_warning = 0.0


def redis_unreachable(what: str) -> None:
    """Log, at most every 10 s per process, that the breakers' Redis did not answer."""
    global _last_unreachable_warning
    now = time.monotonic()
    if now - _last_unreachable_warning >= 10.0:
        _last_unreachable_warning = now
        logger.warning("Redis (REDIS_URL) unreachable: could not %s; circuit breakers fail open", what)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
                url = getattr(settings, "REDIS_URL", "")
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


def monotonic_now() -> float:
    """Wall-clock seconds: breakers compare times across processes, so not time.monotonic()."""
    return time.time()


def breaker_state(deployment_id: int) -> str:
    """closed / open / half_open, for pages and the API."""
    return breakers().state(deployment_id).get("state", CLOSED)
