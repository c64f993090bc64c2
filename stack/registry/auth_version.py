"""The authorisation version: a counter that moves whenever what some token may do changes.

A process may cache what it learnt about a token (its user, roles and workflows: a
stack.registry.access.TokenGrant) only together with the version it read *before* it read the
database, and may use the cached grant only while the shared version still has that value. So a
revoked token, a removed role, a deactivated user or a token's new workflow list takes effect on
the next request in every process, at the cost of one Redis GET per request.

What moves it (stack.registry.signals, and api_token_revoke for its queryset UPDATE): a token
saved, deleted, revoked or given other workflows; a user saved (except a login's `last_login`
stamp) or deleted; a user's groups changed from either side; a group saved or deleted. It moves
after the transaction commits (a process that re-reads the database after seeing the new value
sees the change) and at once (this process drops what it cached).

Failing safe: without REDIS_URL there is no shared version, and while Redis does not answer the
version is unknown; either way `read` answers None and callers authenticate from the database
on every request. A bump that could not reach Redis is logged; every process that notices Redis
unreachable drops its cache, and a cached grant is re-read at least every
stack.registry.access.GRANT_MAX_AGE_SECONDS whatever the version says.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import transaction

AUTH_VERSION_KEY = "sy:authver"
logger = logging.getLogger(__name__)


class _AuthVersion:
    def __init__(self) -> None:
        self._redis: Any = None
        self._down_errors: tuple[type[BaseException], ...] = ()
        self._warned_at = 0.0
        url = getattr(settings, "REDIS_URL", "")
        if url:
            import redis  # only with REDIS_URL (the embedded demo runs without it)

            self._redis = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
            self._down_errors = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)

    @property
    def shared(self) -> bool:
        return self._redis is not None

    def _unreachable(self, what: str) -> None:
        # Whatever was cached may have missed a bump while Redis was away: drop it.
        grant_caches_drop()
        now = time.monotonic()
        if now - self._warned_at > 10.0:
            self._warned_at = now
            logger.warning(
                "Redis (REDIS_URL) unreachable: could not %s; tokens are checked in the database", what
            )

    def read(self) -> bytes | None:
        """The shared version (an opaque value), or None when there is none to trust."""
        if self._redis is None:
            return None
        try:
            value = self._redis.get(AUTH_VERSION_KEY)
        except self._down_errors:
            self._unreachable("read the authorisation version")
            return None
        # A missing key (a Redis that restarted empty) is a value too: b"" differs from every
        # number INCR leaves there, so grants cached before the restart are not used after it.
        return value if value is not None else b""

    def bump(self) -> None:
        grant_caches_drop()
        if self._redis is None:
            return
        try:
            self._redis.incr(AUTH_VERSION_KEY)
        except self._down_errors:
            self._unreachable("move the authorisation version")


_cache_droppers: list[Callable[[], None]] = []


def grant_cache_register(drop: Callable[[], None]) -> None:
    """`drop` (no arguments) empties a cache of grants; it is called whenever the version moves
    in this process or Redis is found unreachable."""
    if drop not in _cache_droppers:
        _cache_droppers.append(drop)


def grant_caches_drop() -> None:
    for drop in list(_cache_droppers):
        drop()


_version: _AuthVersion | None = None
_version_lock = threading.Lock()


def auth_version() -> _AuthVersion:
    global _version
    if _version is None:
        with _version_lock:
            if _version is None:
                _version = _AuthVersion()
    return _version


def auth_version_reset() -> None:
    """Forget the Redis client (tests that change REDIS_URL)."""
    global _version
    with _version_lock:
        _version = None


def auth_version_bump() -> None:
    """Something a token's grant depends on changed: move the version now and after commit."""
    version = auth_version()
    version.bump()
    transaction.on_commit(version.bump)
