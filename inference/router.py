"""The router: executes a workflow's current routing-policy version.

Public entry points (used by the gateway, the eval runner and batch jobs):

    route(*, workflow, request, endpoint=Endpoint.CHAT, client_request_id=None, deadline_s=None)
        -> RouteResult
    route_stream(...) -> RouteStream   (iterate for StreamChunk; .result once exhausted)

Both record one InferenceRequest with every attempt, a UsageRecord per billed attempt and a
FailoverEvent per failed attempt that led to another. A request that fails on every
deployment comes back as a RouteResult with ok=False (recorded as failed); BudgetExhausted is
raised (after recording) when the workflow's hard budget is spent; NoRoute when the workflow
has no policy. With a client_request_id seen before, the stored result is returned and nothing
is called or billed again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from inference.adapters.base import Completion, InferenceInput
from inference.models import Endpoint
from stack.models import Workflow


class NoRoute(LookupError):
    """The workflow has no routing policy (or none of its deployments is enabled)."""


@dataclass
class AttemptInfo:
    position: int
    deployment_id: int
    deployment_slug: str
    outcome: str
    status_code: int | None
    latency_ms: float
    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal = Decimal("0")
    error: str = ""


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
    error: str = ""
    status_code: int | None = None  # of the last failed attempt, when ok is False
    attempts: list[AttemptInfo] = field(default_factory=list)
    replayed: bool = False  # answered from an earlier request with the same client_request_id


def route(
    *,
    workflow: Workflow,
    request: InferenceInput,
    endpoint: str = Endpoint.CHAT,
    client_request_id: str | None = None,
    deadline_s: float | None = None,
) -> RouteResult:
    """Serve `request` for `workflow` by its current policy version (see the module docstring)."""
    raise NotImplementedError
