"""A generation counter: a Redis value that every process compares with the one it cached
under, INCR'd whenever what the caches hold may have changed (the route plans'
`inference.selectors.generation`, the token grants' `registry.auth.version`).

Its users differ in what they do without Redis, so the counter only says what it knows: the
shared value, or None when there is none to trust (no Redis configured, or it did not answer);
`local` counts this process's bumps for a user that falls back to it. Redis not answering is
never an error here: the counter reports it to `on_unreachable` (to log it, drop caches) and
answers None, and a bump that could not reach Redis is lost (the next one reaches every
process).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import redis

from registry.shared_redis.client import REDIS_DOWN_ERRORS, redis_client

GENERATION_TIMEOUT_S = 1.0  # one GET per request: a Redis that does not answer fails fast


class GenerationCounter:
    def __init__(self, key: str, *, url: str, name: str, on_unreachable: Callable[[str], None]) -> None:
        """`key`: the Redis key INCR'd; `url`: the Redis (empty: none, the counter is local);
        `name`: what the counter is, for the messages (`could not read the <name>`)."""
        self.key = key
        self.name = name
        self.local = 0
        self._on_unreachable = on_unreachable
        self._redis: redis.Redis | None = redis_client(url, timeout=GENERATION_TIMEOUT_S) if url else None

    @property
    def shared(self) -> bool:
        """Whether the value lives in Redis (seen by every process) or only in this one."""
        return self._redis is not None

    def read(self) -> bytes | None:
        """The shared value as Redis holds it, b"" when the key is missing (a Redis that restarted
        empty: b"" differs from every number INCR leaves there); None without Redis or while
        it does not answer."""
        if self._redis is None:
            return None
        try:
            # bytes: the factory's clients do not decode responses.
            value = cast(bytes | None, self._redis.get(self.key))
        except REDIS_DOWN_ERRORS:
            self._on_unreachable(f"read the {self.name}")
            return None
        return value if value is not None else b""

    def bump(self) -> None:
        """Move the counter: at once in this process (`local`), then in Redis if it answers."""
        self.local += 1
        if self._redis is None:
            return
        try:
            self._redis.incr(self.key)
        except REDIS_DOWN_ERRORS:
            self._on_unreachable(f"move the {self.name}")
