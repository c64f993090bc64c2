"""What every breaker shares: its states, its settings, the clock it compares across processes,
and the one warning that its Redis did not answer."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings

if TYPE_CHECKING:
    from inference.router.policy import Peek

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
        failure_rate=settings.INFERENCE_BREAKER_FAILURE_RATE,
        min_requests=settings.INFERENCE_BREAKER_MIN_REQUESTS,
        window_calls=settings.INFERENCE_BREAKER_WINDOW_CALLS,
        window_s=settings.INFERENCE_BREAKER_WINDOW_SECONDS,
        cooldown_s=settings.INFERENCE_BREAKER_COOLDOWN_SECONDS,
    )


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


def monotonic_now() -> float:
    """Wall-clock seconds: breakers compare times across processes, so not time.monotonic()."""
    return time.time()


@dataclass(frozen=True)
class PeekAsk:
    """A route's breakers and the route-cache generation, read inside another Redis script's
    call (the rate limits': inference.ratelimit.redis_counters) so that a /v1 request makes one
    round trip for both; the router then peeks no more (inference.router.calls)."""

    generation_key: str
    deployment_ids: tuple[int, ...]
    now: float
    cooldown_s: float


@dataclass(frozen=True)
class PeekAnswer:
    """What that call read: the generation, and each breaker's Peek at `PeekAsk.now`."""

    generation: int
    states: dict[int, Peek]
