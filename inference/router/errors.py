"""What the router answers: RouteResult, and the refusals it raises before calling anything."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal

from inference.adapters.base import (
    Completion,
)
from inference.models import InferenceAttempt
from inference.recording import AttemptInfo
from inference.selectors import (
    PlanEntry,
)

Outcome = InferenceAttempt.Outcome


class NoRoute(LookupError):
    """The workflow has no routing policy (or none of its deployments is enabled)."""


# The request field a missing capability is about, for the 400's `param`.
FEATURE_PARAM = {
    "tools": "tools",
    "json_schema": "response_format",
    "vision": "messages",
    "embeddings": "model",
    "context": "max_tokens",
}


class CapabilityMissing(ValueError):
    """No deployment of the route can serve what the request needs (tools, a JSON schema,
    images, embeddings, its length); nothing was called."""

    def __init__(self, missing: str, workflow: str) -> None:
        what = "the request's length (prompt and max_tokens)" if missing == "context" else missing
        super().__init__(f"No deployment of workflow {workflow!r} can serve {what}")
        self.missing = missing
        self.param = FEATURE_PARAM.get(missing)


_OVER_COST = re.compile(r"estimated cost (?P<estimate>[0-9.]+) over max_cost_per_request (?P<limit>[0-9.]+)")


def over_cost_error(estimate: Decimal, limit: Decimal) -> str:
    """An OVER_COST attempt's recorded error (read back by CostLimitExceeded.recorded)."""
    return f"estimated cost {estimate:.9f} over max_cost_per_request {limit:f}"


class CostLimitExceeded(ValueError):
    """Every deployment's estimate for the request is above the policy's max_cost_per_request;
    nothing was called. `estimate` is the lowest estimate, `limit` the policy's limit."""

    def __init__(self, *, estimate: Decimal, limit: Decimal, currency: str) -> None:
        super().__init__(
            f"The request's estimated cost {estimate:.6f} {currency} is above this workflow's "
            f"max_cost_per_request {limit:f} {currency}: lower max_tokens or shorten the prompt"
        )
        self.estimate = estimate
        self.limit = limit

    @classmethod
    def recorded(cls, errors: list[str], currency: str) -> CostLimitExceeded | None:
        """The refusal again from its attempts' recorded errors (over_cost_error), the lowest
        estimate as when it was raised; None when none is one."""
        found = [m for m in (_OVER_COST.fullmatch(e) for e in errors) if m is not None]
        if not found:
            return None
        low = min(found, key=lambda m: Decimal(m["estimate"]))
        return cls(estimate=Decimal(low["estimate"]), limit=Decimal(low["limit"]), currency=currency)


@dataclass
class RouteResult:
    ok: bool
    request_id: int | None
    deployment_id: int | None
    deployment_slug: str
    completion: Completion | None
    cost: Decimal
    currency: str = "USD"
    latency_ms: float = 0.0
    ttft_ms: float | None = None
    error: str = ""
    status_code: int | None = None  # of the last failed attempt, when ok is False
    attempts: list[AttemptInfo] = field(default_factory=list)
    replayed: bool = False  # answered from an earlier request with the same client_request_id
    policy_version: int | None = None
    demoted: list[tuple[PlanEntry, float]] = field(default_factory=list)
    # When nothing answered: the shortest wait (seconds) before a rate-limited deployment of the
    # route takes calls again (its provider's Retry-After); None when none is cooling down.
    retry_after: float | None = None
    # Answered from the response cache (inference.cache): what the answer cost when bought.
    cost_avoided: Decimal | None = None
    # Answered by semantic matching (inference.cache.semantic): the prompts' cosine similarity.
    cache_similarity: float | None = None
    # When nothing answered because an adapter refused the request before calling (a field its
    # provider's format cannot carry): its words, which the caller is shown.
    refusal: str = ""
