"""Rate limits on /v1: requests and tokens per minute, per API key and per workflow.

A request is checked after its key, body and workflow are, before it is routed: every limit
that applies (the key's RPM and TPM, its team's RPM and TPM, counting every key of the team
together, and the workflow's RPM and TPM) is decided at once, all or nothing, in one Redis script call
(inference.ratelimit.redis_counters); a key and a workflow without limits cost nothing. Tokens are
counted before the call with the whole request's count (inference.admission.request_tokens:
input with tools, images and template, plus max_tokens) and corrected with the usage the provider
reported afterwards (`RateCheck.settle`). "Per minute" is SWITCHYARD_RATE_LIMIT_WINDOW_SECONDS
long. Jobs (batch lines, eval runs, replays, judges) count in the same windows through the same
`rate_decide`, waiting where /v1 refuses (inference.admission.call_pace).

Every /v1 answer where a limit applies carries OpenAI's headers
(x-ratelimit-{limit,remaining,reset}-{requests,tokens}: the tightest of the limits of that unit);
a refusal is a 429 with Retry-After (whole seconds).

Redis unreachable: the request is let through (fail open, logged) unless its key has
`rate_limit_fail_closed`, which makes it a 503. Without a Redis URL the counters are kept per
process (inference.ratelimit.window.LocalWindows): the embedded demo's single web process.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from django.conf import settings

from inference.ratelimit.redis_counters import RedisWindows
from inference.ratelimit.window import REQUESTS, TOKENS, Decision, Limit, LocalWindows
from registry.auth.version import AUTH_VERSION_KEY, auth_version

if TYPE_CHECKING:
    from collections.abc import Sequence

    from inference.breaker.state import PeekAnswer, PeekAsk
    from registry.auth.access import TokenGrant
    from registry.models import Workflow

logger = logging.getLogger(__name__)


class _Store(Protocol):
    def decide(
        self,
        limits: Sequence[Limit],
        costs: Sequence[int],
        *,
        version_key: str | None = None,
        peek: PeekAsk | None = None,
    ) -> Decision: ...
    def correct(self, limit: Limit, slot: int, delta: int) -> None: ...


class StaleGrant(Exception):  # noqa: N818 (a signal to start over, not an error)
    """The cached grant the request was checked with is older than the authorisation version:
    the gateway starts the request over with the grant read afresh."""


class RateLimited(Exception):
    """A limit refuses the request (429), or the limits cannot be checked for a key that fails
    closed (503)."""

    def __init__(self, message: str, *, status: int, decision: Decision | None) -> None:
        super().__init__(message)
        self.status = status
        self.decision = decision


_store: _Store | None = None
_store_lock = threading.Lock()
_warned_at = 0.0


def rate_limiter() -> _Store:
    global _store
    if _store is None:
        with _store_lock:
            if _store is None:
                url = settings.RATE_LIMIT_REDIS_URL
                window = settings.RATE_LIMIT_WINDOW_SECONDS
                if url:
                    _store = RedisWindows(url, window)
                else:
                    _store = LocalWindows(window)
    return _store


def rate_limiter_reset() -> None:
    """Forget the store (tests that change the window or the Redis URL)."""
    global _store
    with _store_lock:
        _store = None


def scope_limits(scopes: Iterable[tuple[str, int | None, int | None, int | None]]) -> list[Limit]:
    """The limits of (scope, id, requests a minute, tokens a minute) rows; a row without an id
    (no key, no team) or a None limit adds none."""
    limits = []
    for scope, ident, rpm, tpm in scopes:
        if ident is None:
            continue
        if rpm is not None:
            limits.append(Limit(scope, ident, REQUESTS, rpm))
        if tpm is not None:
            limits.append(Limit(scope, ident, TOKENS, tpm))
    return limits


class RateStoreDown(Exception):  # noqa: N818 (the store's own error, wrapped)
    """The rate-limit store cannot be reached: the caller fails open or closed as it must."""


def rate_decide(
    limits: Sequence[Limit], tokens: int, *, version_key: str | None = None, peek: PeekAsk | None = None
) -> Decision:
    """Count one provider call (1 request, `tokens` tokens) against every limit, all or nothing:
    the one place a call is counted, for /v1 (RateCheck, which refuses) and for jobs
    (inference.admission.call_pace, which waits). RateStoreDown when the store is unreachable.
    `version_key` and `peek`: read in the same call where the store is the shared Redis."""
    store = rate_limiter()
    costs = [1 if limit.unit == REQUESTS else tokens for limit in limits]
    try:
        return store.decide(limits, costs, version_key=version_key, peek=peek)
    except getattr(store, "down_errors", ()) as exc:
        raise RateStoreDown(str(exc)) from exc


def rate_settle(limits: Sequence[Limit], decision: Decision | None, tokens: int | None) -> None:
    """Correct a counted call's tokens to what the provider reported (None: nothing reported,
    the estimate stands); once per decision, and none for a refused one."""
    if decision is None or not decision.allowed or decision.corrected or tokens is None:
        return
    decision.corrected = True
    store = rate_limiter()
    for limit, cost in zip(limits, decision.costs, strict=True):
        if limit.unit == TOKENS and tokens != cost:
            store.correct(limit, decision.slot, tokens - cost)


def request_limits(caller: TokenGrant, workflow: Workflow) -> list[Limit]:
    return scope_limits(
        (
            ("key", caller.token_id, caller.rpm_limit, caller.tpm_limit),
            ("team", caller.team_id, caller.team_rpm_limit, caller.team_tpm_limit),
            ("workflow", workflow.pk, workflow.rpm_limit, workflow.tpm_limit),
        )
    )


def _down(exc: BaseException, caller: TokenGrant) -> None:
    global _warned_at
    now = time.monotonic()
    if now - _warned_at > 10.0:
        _warned_at = now
        logger.warning("Rate limits not checked, Redis unreachable: %s", exc)
    if caller.rate_limit_fail_closed:
        raise RateLimited(
            "Rate limits cannot be checked (their store is unreachable) and this API key is set to "
            "fail closed; retry later",
            status=503,
            decision=None,
        ) from exc


class RateCheck:
    """One request's rate-limit decision: checked, settled, stamped on the answer."""

    def __init__(self) -> None:
        self.decision: Decision | None = None
        self._limits: list[Limit] = []
        # The route's breakers and generation, when the check's script call read them.
        self.peeked: PeekAnswer | None = None

    def check(
        self,
        *,
        caller: TokenGrant,
        workflow: Workflow,
        tokens: int,
        verify: bytes | None = None,
        peek: Callable[[], PeekAsk | None] | None = None,
    ) -> None:
        """Count the request against every applicable limit, or raise RateLimited.

        `verify`: `caller` is a cached grant read at this authorisation version and not checked
        since (registry.auth.access.cached_grant_unverified); the version is read in the same
        script call as the limits (one Redis round trip for both) and StaleGrant raised when it
        moved. The limits were counted with the stale grant then: an over-count of one request
        at the moment some authorisation changed.

        `peek`: what the router will read of the route's breakers (inference.router.calls
        .route_peek_ask); when this check makes a script call to the Redis the breakers live in,
        they are read in it too (`peeked`), so that the request makes one round trip for the
        version, the limits, the generation and the breakers."""
        limits = request_limits(caller, workflow)
        fold = verify is not None and version_folded()
        if not limits and not fold:
            if verify is not None:
                version_check(verify)
            return
        ask = peek() if peek is not None and version_folded() else None
        try:
            decision = rate_decide(limits, tokens, version_key=AUTH_VERSION_KEY if fold else None, peek=ask)
        except RateStoreDown as exc:
            if verify is not None:
                raise StaleGrant from exc  # the version is unknown: read the grant afresh
            _down(exc, caller)
            return
        if verify is not None:
            if fold:
                if decision.auth_version != verify:
                    raise StaleGrant
            else:
                version_check(verify)
        self.peeked = decision.peek
        if not limits:
            return
        self.decision, self._limits = decision, limits
        if not decision.allowed:
            refused = [
                u for u, c in zip(decision.usages, decision.costs, strict=True) if u.used + c > u.limit.limit
            ]
            what = ", ".join(
                f"{u.limit.limit} {u.limit.unit} per minute for this {u.limit.scope}" for u in refused
            )
            if decision.retry_after_s is None:
                raise RateLimited(
                    f"Request larger than the rate limit ({what})", status=429, decision=decision
                )
            raise RateLimited(
                f"Rate limit reached ({what}); retry after {_retry_after(decision)} s",
                status=429,
                decision=decision,
            )

    def settle(self, tokens: int | None) -> None:
        """Correct the token counts with what the provider reported (None: nothing reported,
        the estimate stands)."""
        rate_settle(self._limits, self.decision, tokens)

    def stamp(self, response: Any) -> Any:
        """The answer with OpenAI's x-ratelimit-* headers (and Retry-After on a 429)."""
        decision = self.decision
        if decision is None:
            return response
        for unit in (REQUESTS, TOKENS):
            usages = [u for u in decision.usages if u.limit.unit == unit]
            if usages:
                tight = min(usages, key=lambda u: (u.remaining, -u.reset_s))
                response[f"x-ratelimit-limit-{unit}"] = str(tight.limit.limit)
                response[f"x-ratelimit-remaining-{unit}"] = str(tight.remaining)
                response[f"x-ratelimit-reset-{unit}"] = duration_text(tight.reset_s)
        if not decision.allowed and decision.retry_after_s is not None:
            response["Retry-After"] = str(_retry_after(decision))
        return response


def version_folded() -> bool:
    """Is the authorisation version in the rate limits' Redis (read in their script call)?"""
    url = settings.RATE_LIMIT_REDIS_URL
    return bool(url) and url == settings.REDIS_URL


def version_check(expected: bytes) -> None:
    """StaleGrant unless the shared authorisation version is still `expected` (one GET)."""
    if auth_version().read() != expected:
        raise StaleGrant


def _retry_after(decision: Decision) -> int:
    return max(1, math.ceil(decision.retry_after_s or 0))


def duration_text(seconds: float) -> str:
    """A duration as OpenAI writes it in x-ratelimit-reset-*: "20ms", "1.5s", "6m0s"."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    minutes, rest = divmod(round(seconds, 3), 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text
