"""A routed request's context: its plan, and the deployments that may serve it, in order."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings

from billing.budgets import Admission, BudgetExhausted, SpendTarget, spend_target
from inference.adapters.base import (
    EmbeddingRequest,
    RoutedInput,
    request_features,
)
from inference.admission import request_tokens, worst_case_cost
from inference.breaker.state import PeekAnswer
from inference.models import InferenceAttempt
from inference.recording import AttemptInfo
from inference.router.errors import CapabilityMissing, CostLimitExceeded, NoRoute
from inference.router.policy import order_candidates
from inference.selectors import (
    PlanEntry,
    RoutePlan,
    deployment_plan,
    rolling_p50,
    rolling_quality,
    route_plan,
    route_plan_cached,
)
from registry.models import Deployment, Workflow

Outcome = InferenceAttempt.Outcome


def cost_estimate(entry: PlanEntry, request: RoutedInput, *, batch: bool = False) -> Decimal:
    """The call's worst-case cost on `entry`: what a hard budget reserves (inference.admission);
    `batch`: a batch job's line, billed at the batch prices where there are any."""
    return worst_case_cost(entry, request, batch=batch)


def call_target(ctx: Context, entry: PlanEntry) -> SpendTarget:
    """What a call on `entry` spends on, as its ledger row will name it: the workflow (and its
    team), the deployment's provider, the API key."""
    return spend_target(workflow=ctx.workflow, provider=entry.deployment.provider, api_key_id=ctx.api_key_id)


def needs_admission(ctx: Context, target: SpendTarget) -> bool:
    """Only a spend under some active hard-limit budget needs admission (the others would be
    admitted without a reservation); the plan knows those budgets' targets."""
    hard = ctx.plan.hard_budget_keys
    return bool(hard) and any(key in hard for key in target.keys())


@dataclass
class Context:
    workflow: Workflow
    plan: RoutePlan
    request: RoutedInput
    endpoint: str
    started: float
    deadline: float
    attempts: list[AttemptInfo] = field(default_factory=list)
    demoted: list[tuple[PlanEntry, float]] = field(default_factory=list)
    budget_error: BudgetExhausted | None = None
    cost_error: CostLimitExceeded | None = None
    # Hard budgets' admissions this request holds: released once its spend is in the ledger,
    # by the router after an inline recording, else by the journal's fold (inference.recording).
    holds: list[Admission] = field(default_factory=list)
    # Circuit transitions this request's calls caused: (deployment id, "opened"/"closed", the
    # failover code of the call that decided it). Recorded as failover events with the request
    # (by its fold, so the journal keeps them off the answer's path), once per transition: the
    # breaker script hands a transition to exactly one caller.
    breaker_transitions: list[tuple[int, str, str]] = field(default_factory=list)
    deployment: Deployment | None = None  # a one-deployment call: route(deployment=...)
    # The API key the request came with (gateway, batch job, eval run): its budgets apply and
    # the ledger rows name it.
    api_key_id: int | None = None
    # The ledger subject the usage rows are billed to ("training_run:12"); "" bills the request.
    bill_to: str = ""
    # Keep the input and answer (inference.retention): the gateway asks for it for a workflow
    # that opted in; batch lines, evals and replays never do.
    retain: bool = False
    # A /v1 Idempotency-Key request's body hash (inference.idempotency); "" for the others.
    request_digest: str = ""
    # The generation and breakers the gateway's rate-limit call read for this request
    # (inference.router.calls.route_peek_ask); the route's first peek uses them instead.
    peeked: PeekAnswer | None = None


def prepare(
    workflow: Workflow,
    request: RoutedInput,
    endpoint: str,
    deadline_s: float | None,
    *,
    deployment: Deployment | None = None,
    api_key_id: int | None = None,
    retain: bool = False,
) -> Context:
    started = time.perf_counter()
    if deployment is not None:
        plan = deployment_plan(workflow_id=workflow.pk, deployment_id=deployment.pk)
        if plan is None:
            raise NoRoute(f"deployment {deployment.slug} is disabled")
    else:
        plan = route_plan_cached(workflow_id=workflow.pk)
        if plan is None or not plan.entries:
            # A cached "no route" may be stale: ask for the current plan before refusing.
            plan = route_plan(workflow_id=workflow.pk)
        if plan is None:
            raise NoRoute(f"workflow {workflow.slug} has no routing policy")
        if not plan.entries:
            raise NoRoute(f"workflow {workflow.slug} has no enabled deployment in its route")
    deadline_s = deadline_s if deadline_s is not None else settings.INFERENCE_DEADLINE_SECONDS
    return Context(
        workflow=workflow,
        plan=plan,
        request=request,
        endpoint=endpoint,
        started=started,
        deadline=started + deadline_s,
        deployment=deployment,
        api_key_id=api_key_id,
        retain=retain,
    )


def candidates(ctx: Context) -> list[PlanEntry]:
    """The plan's entries in the order its policy gives (inference.router.policy); the ones demoted
    for quality are recorded as skipped attempts."""
    plan = ctx.plan
    policy = plan.policy
    ids = [e.deployment_id for e in plan.entries]
    quality = (
        rolling_quality(workflow_id=plan.workflow_id, deployment_ids=ids) if policy.needs_quality else {}
    )
    p50s = rolling_p50(deployment_ids=ids) if policy.needs_latency else {}
    order, demoted = order_candidates(policy, plan.entries, quality=quality, p50s=p50s)
    order = capable(ctx, order)
    if isinstance(ctx.request, EmbeddingRequest) and order:
        # Vectors of another model would corrupt the caller's vector store: an embeddings
        # request is served by the model of the route's first embeddings deployment (the
        # policy's order, whatever the strategy), failing over only to that same model.
        able = [e for e in plan.entries if "embeddings" in e.capabilities]
        model_id = min(able, key=lambda e: e.position).deployment.model_id
        order = [e for e in order if e.deployment.model_id == model_id]
        demoted = [(e, score) for e, score in demoted if e.deployment.model_id == model_id]
    ctx.demoted = demoted
    for entry, score in demoted:
        ctx.attempts.append(
            AttemptInfo(
                position=len(ctx.attempts),
                entry=entry,
                outcome=Outcome.SKIPPED_QUALITY,
                status_code=None,
                latency_ms=0.0,
                error=f"rolling quality {score:.3f} below the floor {policy.quality_floor:.3f}",
            )
        )
    return order


def context_tokens(request: RoutedInput) -> int:
    """The tokens the request occupies: its whole input plus max_tokens (inference.admission)."""
    return request_tokens(request)


def capable(ctx: Context, order: list[PlanEntry]) -> list[PlanEntry]:
    """The deployments that can serve the request's features; the others are recorded as
    skipped. A fallback without tool support must not answer a tool request in plain text."""
    needed = request_features(ctx.request)
    limited = any(e.max_context_tokens is not None for e in order)
    if not needed and not limited:
        return order
    context = context_tokens(ctx.request) if limited else 0
    able: list[PlanEntry] = []
    first_missing = ""
    for entry in order:
        missing = sorted(needed - entry.capabilities)
        if entry.max_context_tokens is not None and context > entry.max_context_tokens:
            missing.append("context")
        if not missing:
            able.append(entry)
            continue
        first_missing = first_missing or missing[0]
        ctx.attempts.append(
            AttemptInfo(
                position=len(ctx.attempts),
                entry=entry,
                outcome=Outcome.UNSUPPORTED,
                status_code=None,
                latency_ms=0.0,
                error=f"cannot serve {', '.join(missing)}",
            )
        )
    if not able and order:
        raise CapabilityMissing(first_missing, ctx.workflow.slug)
    return able
