"""Sliding-window counters for the /v1 rate limits: the data and the in-process store.

A limit ("60 requests per minute for key 7") is counted in a window of `slots` equal slots
(20 by default: 3 s each at one minute). A request is admitted when, for every limit that
applies, what the slots still inside the window hold plus the request's cost stays within the
limit; then its cost is added to the current slot of every one of them, and to none when one of
them refuses (all or nothing). A slot leaves the window `slots` slots after it began, so what was
counted is forgotten between window - slot and window after it happened: the "sliding window
counter" of Cloudflare's rate limiting write-up
(https://blog.cloudflare.com/counting-things-a-lot-of-different-things/), with slots instead of
one previous window so no weighting guess is needed. A refused request waits until enough of the
oldest slots have left (Retry-After); the window is "reset" when the newest counted slot has left.

The same arithmetic runs in Redis as one Lua script (inference.ratelimit.redis_counters) and here, in
process, for the embedded demo without REDIS_URL (counters per process then).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inference.breaker.state import PeekAnswer, PeekAsk

SLOTS = 20
REQUESTS = "requests"
TOKENS = "tokens"


@dataclass(frozen=True)
class Limit:
    """One limit that applies to a request: who it counts (`scope`, `ident`), what, how many."""

    scope: str  # "key", "team" or "workflow"
    ident: int
    unit: str  # REQUESTS or TOKENS
    limit: int

    @property
    def store_key(self) -> str:
        return f"sy:rl:{self.scope}:{self.ident}:{self.unit}"


@dataclass(frozen=True)
class Usage:
    """A limit as it stood after the decision."""

    limit: Limit
    used: int
    reset_s: float  # until nothing counted now is still in the window

    @property
    def remaining(self) -> int:
        return max(0, self.limit.limit - self.used)


@dataclass
class Decision:
    allowed: bool
    slot: int  # where the costs were counted (a later correction goes there)
    usages: list[Usage]
    costs: list[int]
    retry_after_s: float | None = None  # refused: when it may pass; None: never (cost > limit)
    corrected: bool = field(default=False)
    # The authorisation version read in the same call (inference.ratelimit.redis_counters); None: not read.
    auth_version: bytes | None = None
    # A route's breakers and the route-cache generation read in the same call; None: not read.
    peek: PeekAnswer | None = None


def window_ms(window_s: float) -> tuple[int, int]:
    """(slot length in ms, slots per window)."""
    slot = max(1, round(window_s * 1000 / SLOTS))
    return slot, SLOTS


def window_decide(
    slots_by_limit: Sequence[dict[int, int]],
    limits: Sequence[Limit],
    costs: Sequence[int],
    *,
    now_ms: int,
    slot_ms: int,
    nslots: int,
) -> Decision:
    """Decide, and on admission count, one request against every limit (mutates the slot maps).

    The reference of the Lua script in inference.ratelimit.redis_counters, which does the same."""
    cur = now_ms // slot_ms
    oldest = cur - nslots + 1
    used: list[int] = []
    allowed = True
    for slots, limit, cost in zip(slots_by_limit, limits, costs, strict=True):
        for s in [s for s in slots if s < oldest]:
            del slots[s]
        total = max(0, sum(slots.values()))
        used.append(total)
        if total + cost > limit.limit:
            allowed = False
    wait: float | None = 0.0
    if allowed:
        for slots, cost in zip(slots_by_limit, costs, strict=True):
            slots[cur] = slots.get(cur, 0) + cost
    else:
        for slots, limit, cost, total in zip(slots_by_limit, limits, costs, used, strict=True):
            need = total + cost - limit.limit
            if need <= 0:
                continue
            if cost > limit.limit:
                wait = None
                break
            freed = 0
            for s in sorted(slots):
                freed += slots[s]
                if freed >= need:
                    assert wait is not None  # noqa: S101 (None breaks out above)
                    wait = max(wait, ((s + nslots) * slot_ms - now_ms) / 1000)
                    break
    usages = []
    for slots, limit, cost, total in zip(slots_by_limit, limits, costs, used, strict=True):
        newest = max(slots) if slots else None
        reset = 0.0 if newest is None else max(0.0, ((newest + nslots) * slot_ms - now_ms) / 1000)
        usages.append(Usage(limit, total + cost if allowed else total, reset))
    return Decision(allowed, cur, usages, list(costs), retry_after_s=None if allowed else wait)


class LocalWindows:
    """The counters in this process (no REDIS_URL): the same decisions, not shared."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.time) -> None:
        self._slot_ms, self._nslots = window_ms(window_s)
        self._clock = clock
        self._slots: dict[str, dict[int, int]] = {}
        self._lock = threading.Lock()

    def decide(
        self,
        limits: Sequence[Limit],
        costs: Sequence[int],
        *,
        version_key: str | None = None,
        peek: PeekAsk | None = None,
    ) -> Decision:
        # No Redis here: no shared authorisation version or breakers either (version_key and
        # peek are not read).
        now_ms = int(self._clock() * 1000)
        with self._lock:
            maps = [self._slots.setdefault(limit.store_key, {}) for limit in limits]
            decision = window_decide(
                maps, limits, costs, now_ms=now_ms, slot_ms=self._slot_ms, nslots=self._nslots
            )
            for key in [k for k, v in self._slots.items() if not v]:
                del self._slots[key]  # keys of limits no longer used do not pile up
            return decision

    def correct(self, limit: Limit, slot: int, delta: int) -> None:
        with self._lock:
            slots = self._slots.get(limit.store_key)
            if slots is not None and slot in slots:
                slots[slot] += delta
