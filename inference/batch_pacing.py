"""Pacing batch lines under the rate limits that /v1 callers obey, waiting rather than failing.

A batch line counts against the same windows as a /v1 request (inference.ratelimit: the same
Redis keys): its API key's limits, its key's team's (or, for a job asked for from a page, its
workflow's team's), the workflow's, and the job's own `max_rpm` (scope "batch"). Where /v1
answers 429, a line waits until the window lets it through (`retry_after_s`), so a replay never
takes the capacity live traffic was promised and never fails for being fast. A line larger than
a token limit can ever admit fails with that reason (waiting would not help).

Redis unreachable: the line goes through (fail open, as /v1 does for keys that do not fail closed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from inference.models import BatchJob
from inference.ratelimit import rate_limiter, scope_limits
from inference.ratelimit_window import REQUESTS, TOKENS, Decision, Limit

# One wait is at most this long before the lease is renewed and the window asked again.
MAX_WAIT_S = 5.0


class LineTooLarge(Exception):  # noqa: N818 (a refusal reported on the line)
    """The line's token estimate exceeds a token limit: no window will ever admit it."""


@dataclass
class Paced:
    decision: Decision | None
    limits: list[Limit]
    waits: int = 0


def batch_limits(job: BatchJob) -> list[Limit]:
    """The limits a line of `job` counts against (the /v1 ones of its key, team and workflow)."""
    workflow = job.workflow
    key = job.api_key
    team = key.team if key is not None and key.team_id is not None else workflow.team
    return scope_limits(
        (
            ("key", key.pk if key else None, key.rpm_limit if key else None, key.tpm_limit if key else None),
            (
                "team",
                team.pk if team else None,
                team.rpm_limit if team else None,
                team.tpm_limit if team else None,
            ),
            ("workflow", workflow.pk, workflow.rpm_limit, workflow.tpm_limit),
            ("batch", job.pk, job.max_rpm, None),
        )
    )


def batch_line_pace(
    *,
    limits: list[Limit],
    tokens: int,
    keep_lease: Callable[[], bool],
    sleep: Callable[[float], None] = time.sleep,
) -> Paced:
    """Count one line against `limits`, waiting while a window is full. `keep_lease` is called
    after each wait: False (the lease was lost, the job cancelled) stops waiting at once."""
    if not limits:
        return Paced(None, limits)
    store = rate_limiter()
    costs = [1 if limit.unit == REQUESTS else tokens for limit in limits]
    waits = 0
    while True:
        try:
            decision = store.decide(limits, costs)
        except getattr(store, "down_errors", ()):
            return Paced(None, limits, waits)
        if decision.allowed:
            return Paced(decision, limits, waits)
        if decision.retry_after_s is None:
            raise LineTooLarge("the line's tokens exceed a token-per-minute limit")
        sleep(min(max(decision.retry_after_s, 0.01), MAX_WAIT_S))
        waits += 1
        if not keep_lease():
            return Paced(None, limits, waits)


def batch_line_settle(paced: Paced, tokens_used: int | None) -> None:
    """Correct the token counts with what the provider reported, as /v1 does."""
    decision = paced.decision
    if decision is None or tokens_used is None:
        return
    store = rate_limiter()
    for limit, cost in zip(paced.limits, decision.costs, strict=True):
        if limit.unit == TOKENS and tokens_used != cost:
            store.correct(limit, decision.slot, tokens_used - cost)
