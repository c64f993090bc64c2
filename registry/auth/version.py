"""The authorisation version: a counter that moves whenever what some token may do changes.

A process may cache what it learnt about a token (its user, roles and workflows: a
registry.auth.access.TokenGrant) only together with the version it read *before* it read the
database, and may use the cached grant only while the shared version still has that value. So a
revoked token, a removed role, a deactivated user or a token's new workflow list takes effect on
the next request in every process, at the cost of one Redis GET per request.

What moves it (registry.auth.signals, and api_token_revoke for its queryset UPDATE): a token
saved, deleted, revoked or given other workflows; a user saved (except a login's `last_login`
stamp) or deleted; a user's groups changed from either side; a group saved or deleted. It moves
after the transaction commits (a process that re-reads the database after seeing the new value
sees the change) and at once (this process drops what it cached).

Failing safe: without REDIS_URL there is no shared version, and while Redis does not answer the
version is unknown; either way `read` answers None and callers authenticate from the database
on every request. A bump that could not reach Redis is logged; every process that notices Redis
unreachable drops its cache, and a cached grant is re-read at least every
registry.auth.access.GRANT_MAX_AGE_SECONDS whatever the version says.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import transaction

from registry.shared_redis.generation import GenerationCounter

AUTH_VERSION_KEY = "sy:authver"
logger = logging.getLogger(__name__)


class _AuthVersion:
    def __init__(self) -> None:
        self._warned_at = 0.0
        # Without REDIS_URL (the embedded demo) there is no shared version: `read` answers None.
        self.counter = GenerationCounter(
            AUTH_VERSION_KEY,
            url=settings.REDIS_URL,
            name="authorisation version",
            on_unreachable=self._unreachable,
        )

    @property
    def shared(self) -> bool:
        return self.counter.shared

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
        return self.counter.read()

    def bump(self) -> None:
        grant_caches_drop()
        self.counter.bump()


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


def auth_version_bump() -> None:
    """Something a token's grant depends on changed: move the version now and after commit."""
    version = auth_version()
    version.bump()
    transaction.on_commit(version.bump)
