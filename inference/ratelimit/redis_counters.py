"""The /v1 rate-limit counters in Redis: one Lua script call per request for every limit.

The script is inference.ratelimit.window.window_decide in Lua (same slots, same answers), so
checking a key's and its workflow's requests and tokens is atomic and costs one round trip
(EVALSHA; redis-py's Script loads it again after a Redis restart). Time is Redis's own (TIME),
so web processes on hosts with different clocks agree on the window.

Token corrections (a request counted with its estimate, corrected with what the provider
reported) are not sent on their own: they wait in this process and go with the next script call
that touches the same counter (`pending`), and change the slot the estimate went to, unless
that slot has left the window (then there is nothing to correct). Corrections still waiting
when a process ends, or when the call that carried them failed, are lost; the window forgets the
estimate anyway.

No maintained Python limiter fitted: `limits` and `pyrate-limiter` check one limit per call,
neither counts a weight that is corrected afterwards, and all-or-nothing across a key's and a
workflow's limits would need a lock around several calls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import redis

from inference.breaker.redis_breakers import PEEK_LUA, breaker_key
from inference.breaker.state import PeekAnswer, PeekAsk
from inference.ratelimit.window import Decision, Limit, Usage, window_ms
from inference.router.policy import Peek
from registry.shared_redis.client import redis_client

# KEYS: one hash per limit (field: slot number, value: what was counted in it), then, when
# ARGV[3] is 1, the authorisation version's key (registry.auth.version), read here so the
# gateway needs no GET of its own; then, when ARGV[4] (n) is above 0, the route-cache generation's
# key and n breaker hashes (a PeekAsk: inference.breaker.state), read here so the router needs no
# peek of its own. Nothing but the limits is written.
# ARGV: slot_ms, nslots, 0/1, n, the breakers' clock and cooldown (0 0 when n is 0), then per
# limit: limit, cost, m, and m pairs (slot, delta) of corrections.
# Returns: allowed (1/0), the current slot, retry-after ms (-1: never), then per limit used, reset
# ms, then (when asked) the version ("" when the key is missing), then (when asked) the
# generation and a Peek per breaker.
SCRIPT = (
    PEEK_LUA
    + """
local slot_ms = tonumber(ARGV[1])
local nslots = tonumber(ARGV[2])
local nver = tonumber(ARGV[3])
local npeek = tonumber(ARGV[4])
local nlim = #KEYS - nver
if npeek > 0 then nlim = nlim - npeek - 1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cur = math.floor(now / slot_ms)
local oldest = cur - nslots + 1
local a = 7
local limits, costs, used, live = {}, {}, {}, {}
local allowed = 1
for i = 1, nlim do
  local key = KEYS[i]
  limits[i] = tonumber(ARGV[a]); costs[i] = tonumber(ARGV[a + 1])
  local m = tonumber(ARGV[a + 2]); a = a + 3
  for j = 1, m do
    local s = tonumber(ARGV[a]); local d = tonumber(ARGV[a + 1]); a = a + 2
    if s >= oldest and redis.call('HEXISTS', key, s) == 1 then redis.call('HINCRBY', key, s, d) end
  end
  local h = redis.call('HGETALL', key)
  local total, slots = 0, {}
  for j = 1, #h, 2 do
    local s = tonumber(h[j])
    if s < oldest then redis.call('HDEL', key, h[j])
    else local v = tonumber(h[j + 1]); total = total + v; slots[#slots + 1] = {s, v} end
  end
  table.sort(slots, function(x, y) return x[1] < y[1] end)
  if total < 0 then total = 0 end
  used[i] = total; live[i] = slots
  if total + costs[i] > limits[i] then allowed = 0 end
end
local wait = 0
if allowed == 1 then
  for i = 1, nlim do
    redis.call('HINCRBY', KEYS[i], cur, costs[i])
    redis.call('PEXPIRE', KEYS[i], (nslots + 1) * slot_ms)
    used[i] = used[i] + costs[i]
    local s = live[i]
    if #s == 0 or s[#s][1] ~= cur then s[#s + 1] = {cur, costs[i]} end
  end
else
  for i = 1, nlim do
    local need = used[i] + costs[i] - limits[i]
    if need > 0 then
      if costs[i] > limits[i] then wait = -1; break end
      local freed = 0
      for _, sv in ipairs(live[i]) do
        freed = freed + sv[2]
        if freed >= need then
          local w = (sv[1] + nslots) * slot_ms - now
          if w > wait then wait = w end
          break
        end
      end
    end
  end
end
local out = {allowed, cur, wait}
for i = 1, nlim do
  local s = live[i]
  local reset = 0
  if #s > 0 then reset = (s[#s][1] + nslots) * slot_ms - now end
  out[#out + 1] = used[i]; out[#out + 1] = reset
end
if nver == 1 then
  local v = redis.call('GET', KEYS[nlim + 1])
  if v then out[#out + 1] = v else out[#out + 1] = '' end
end
if npeek > 0 then
  local g = nlim + nver + 1
  out[#out + 1] = tonumber(redis.call('GET', KEYS[g]) or '0')
  local pnow = tonumber(ARGV[5]); local cooldown = tonumber(ARGV[6])
  for i = g + 1, #KEYS do out[#out + 1] = peek(KEYS[i], pnow, cooldown) end
end
return out
"""
)


DOWN_BACKOFF_SECONDS = 1.0


class RedisWindows:
    def __init__(self, url: str, window_s: float) -> None:
        # Short timeouts: a Redis that does not answer must not hold every /v1 request long.
        self._redis = redis_client(url, timeout=0.5)
        self._script: Any = self._redis.register_script(SCRIPT)
        self.down_errors: tuple[type[BaseException], ...] = (
            redis.exceptions.ConnectionError,
            redis.exceptions.TimeoutError,
            redis.exceptions.BusyLoadingError,
        )
        self._slot_ms, self._nslots = window_ms(window_s)
        self._pending: dict[str, dict[int, int]] = {}
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._connection_error = redis.exceptions.ConnectionError

    def decide(
        self,
        limits: Sequence[Limit],
        costs: Sequence[int],
        *,
        version_key: str | None = None,
        peek: PeekAsk | None = None,
    ) -> Decision:
        """`peek`: read a route's breakers and the route-cache generation in the same call (only
        when the breakers live in this Redis: the caller checks)."""
        # After a failure, answer "unreachable" at once for a second instead of making every
        # request wait for a connect timeout against a Redis that is not there.
        if time.monotonic() < self._down_until:
            raise self._connection_error("rate-limit Redis unreachable a moment ago")
        try:
            return self._decide(limits, costs, version_key, peek)
        except self.down_errors:
            self._down_until = time.monotonic() + DOWN_BACKOFF_SECONDS
            raise

    def _decide(
        self, limits: Sequence[Limit], costs: Sequence[int], version_key: str | None, peek: PeekAsk | None
    ) -> Decision:
        peeked = peek.deployment_ids if peek is not None else ()
        args: list[int | float | str] = [self._slot_ms, self._nslots, 1 if version_key else 0, len(peeked)]
        args += [f"{peek.now:.6f}", peek.cooldown_s] if peek is not None and peeked else [0, 0]
        with self._lock:
            corrections = [self._pending.pop(limit.store_key, {}) for limit in limits]
        for limit, cost, fixes in zip(limits, costs, corrections, strict=True):
            args += [limit.limit, cost, len(fixes)]
            for slot, delta in fixes.items():
                args += [slot, delta]
        keys = [limit.store_key for limit in limits] + ([version_key] if version_key else [])
        if peek is not None and peeked:
            keys += [peek.generation_key, *(breaker_key(d) for d in peeked)]
        out = self._script(keys=keys, args=args)
        allowed, slot, wait = bool(out[0]), int(out[1]), int(out[2])
        usages = [
            Usage(limit, int(out[3 + 2 * i]), max(0, int(out[4 + 2 * i])) / 1000)
            for i, limit in enumerate(limits)
        ]
        retry = None if allowed or wait < 0 else wait / 1000
        at = 3 + 2 * len(limits)
        version = bytes(out[at]) if version_key else None
        at += 1 if version_key else 0
        answer = (
            PeekAnswer(int(out[at]), {d: Peek(int(x)) for d, x in zip(peeked, out[at + 1 :], strict=True)})
            if peeked
            else None
        )
        return Decision(
            allowed, slot, usages, list(costs), retry_after_s=retry, auth_version=version, peek=answer
        )

    def correct(self, limit: Limit, slot: int, delta: int) -> None:
        with self._lock:
            if len(self._pending) > 10_000:  # keys that stopped calling: drop their corrections
                self._pending.clear()
            fixes = self._pending.setdefault(limit.store_key, {})
            fixes[slot] = fixes.get(slot, 0) + delta
