"""The breakers in Redis: one hash per deployment, changed only by Lua scripts, so that every
transition is atomic across processes (the embedded default without Redis is
inference.breaker.breakers.LocalBreakers)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from inference.breaker.state import CLOSED, GENERATION_UNKNOWN, LATENCY_SAMPLES, redis_unreachable
from inference.router.policy import Peek
from registry.shared_redis.client import REDIS_DOWN_ERRORS, redis_client

if TYPE_CHECKING:
    from inference.breaker.state import BreakerSettings


# What a peek answers for one breaker hash, as a Lua function shared by the two peek scripts and
# the rate limits' script (inference.ratelimit.redis_counters, which reads a PeekAsk in its call).
# The numbers are inference.router.policy.Peek's, named here from the enum itself.
PEEK_LUA = f"""
local OPEN, CLOSED, HALF_OPEN = {Peek.OPEN:d}, {Peek.CLOSED:d}, {Peek.HALF_OPEN:d}  -- inference.router.policy.Peek
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
    PEEK_LUA
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
    PEEK_LUA
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


def breaker_key(deployment_id: int) -> str:
    """The Redis hash of a deployment's breaker."""
    return f"sy:cb:{deployment_id}"


def _lat_key(deployment_id: int) -> str:
    return f"sy:lat:{deployment_id}"


def _calls_key(deployment_id: int) -> str:
    return f"sy:cbw:{deployment_id}"


class RedisBreakers:
    """Breakers whose state every process shares (REDIS_URL)."""

    def __init__(self, url: str) -> None:
        self.redis = redis_client(url, timeout=1.0)
        # Redis unreachable (restarting, say): the breakers fail open instead of failing the
        # request. Every circuit reads closed and nothing is recorded until it answers again.
        self.down_errors = REDIS_DOWN_ERRORS
        self._peek = self.redis.register_script(_PEEK)
        self._peek_gen = self.redis.register_script(_PEEK_GEN)
        self._claim = self.redis.register_script(_CLAIM)
        self._record = self.redis.register_script(_RECORD)
        self._cool = self.redis.register_script(_COOL)

    def peek(self, deployment_ids: Sequence[int], *, now: float, cfg: BreakerSettings) -> list[Peek]:
        try:
            out = self._peek(keys=[breaker_key(d) for d in deployment_ids], args=[now, cfg.cooldown_s])
        except self.down_errors:
            redis_unreachable("peek")
            return [Peek.CLOSED] * len(deployment_ids)
        return [Peek(int(x)) for x in out]

    def peek_with_generation(
        self, generation_key: str, deployment_ids: Sequence[int], *, now: float, cfg: BreakerSettings
    ) -> tuple[int, list[Peek]]:
        """(route-cache generation, peek per breaker) in one round trip."""
        keys = [generation_key, *(breaker_key(d) for d in deployment_ids)]
        try:
            out = [int(x) for x in self._peek_gen(keys=keys, args=[now, cfg.cooldown_s])]
        except self.down_errors:
            redis_unreachable("peek")
            return GENERATION_UNKNOWN, [Peek.CLOSED] * len(deployment_ids)
        return out[0], [Peek(x) for x in out[1:]]

    def claim_probe(self, deployment_id: int, *, now: float, cfg: BreakerSettings) -> bool:
        try:
            return bool(self._claim(keys=[breaker_key(deployment_id)], args=[now, cfg.cooldown_s]))
        except self.down_errors:
            redis_unreachable("claim a probe")
            return False

    def record(
        self, deployment_id: int, *, ok: bool, latency_ms: float, now: float, cfg: BreakerSettings
    ) -> tuple[str, str]:
        try:
            state, transition = self._record(
                keys=[breaker_key(deployment_id), _lat_key(deployment_id), _calls_key(deployment_id)],
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
            self._cool(keys=[breaker_key(deployment_id)], args=[f"{until:.6f}"])
        except self.down_errors:
            redis_unreachable("cool a deployment down")

    def cooling(self, deployment_ids: Sequence[int], *, now: float) -> dict[int, float]:
        """Seconds left of each cooling deployment's wait (the failure path only)."""
        pipe = self.redis.pipeline(transaction=False)
        for d in deployment_ids:
            pipe.hget(breaker_key(d), "cool")
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
            raw = self.redis.hgetall(breaker_key(deployment_id))
        except self.down_errors:
            redis_unreachable("read a breaker")
            return {}
        return {_s(k): _s(v) for k, v in raw.items()}

    def states(self, deployment_ids: Sequence[int]) -> dict[int, str]:
        """closed / open / half_open per deployment, in one round trip (for /metrics)."""
        pipe = self.redis.pipeline(transaction=False)
        for d in deployment_ids:
            pipe.hget(breaker_key(d), "state")
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


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
