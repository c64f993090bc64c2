"""After the calls: recording the request, replaying a recorded one, raising a refusal."""

from __future__ import annotations

import time
from typing import Any

from django.utils import timezone

from billing.budgets import BudgetExhausted
from inference.adapters.base import (
    Completion,
    refusal_recorded,
)
from inference.breaker.breakers import breakers
from inference.breaker.state import monotonic_now
from inference.idempotency import answer_kept, answer_kept_until, replay_check
from inference.metrics import route_observe
from inference.models import InferenceAttempt, InferenceRequest
from inference.recording import inference_request_record
from inference.recording.attempts import CALLED
from inference.retention import retained_input
from inference.router.context import Context
from inference.router.errors import CostLimitExceeded, RouteResult
from inference.selectors import (
    PlanEntry,
)
from inference.tracing import route_trace
from registry.models import Workflow
from registry.tracing import tracer

Outcome = InferenceAttempt.Outcome


def finish_request(
    ctx: Context,
    *,
    completion: Completion | None,
    winner: PlanEntry | None,
    stream: bool,
    ttft_ms: float | None,
    client_request_id: str | None,
    request_id: int | None = None,
) -> RouteResult:
    latency_ms = (time.perf_counter() - ctx.started) * 1000.0
    error = ""
    status_code = None
    if winner is None:
        last = next((a for a in reversed(ctx.attempts) if a.outcome != Outcome.OK), None)
        status_code = last.status_code if last is not None else None
        if ctx.budget_error is not None:
            error = str(ctx.budget_error)
        elif last is not None:
            error = f"every deployment failed; last: {last.deployment_slug}: {last.error}"
        else:
            error = "no deployment could be tried"
        if time.perf_counter() >= ctx.deadline:
            error = f"deadline passed; {error}"
        # Only on the failure path: how long until a rate-limited deployment serves again.
        waits = breakers().cooling([e.deployment_id for e in ctx.plan.entries], now=monotonic_now())
        retry_after = min(waits.values()) if waits else None
    else:
        retry_after = None
    keep_answer = answer_kept(client_request_id=client_request_id, retain=ctx.retain)
    row = inference_request_record(
        workflow=ctx.workflow,
        plan=ctx.plan,
        attempts=ctx.attempts,
        endpoint=ctx.endpoint,
        stream=stream,
        winner=winner,
        latency_ms=latency_ms,
        ttft_ms=ttft_ms,
        error=error,
        client_request_id=client_request_id,
        # A /v1 key's answer only for a workflow that keeps prompts, for the replay window.
        response_text=completion.text if (completion is not None and keep_answer) else "",
        response_doc=completion.raw if (completion is not None and keep_answer) else None,
        request_digest=ctx.request_digest,
        answer_kept_until=answer_kept_until(
            client_request_id=client_request_id, retain=ctx.retain, now=timezone.now()
        )
        if completion is not None and keep_answer
        else None,
        demoted=ctx.demoted,
        holds=ctx.holds,
        breaker_transitions=ctx.breaker_transitions,
        api_key_id=ctx.api_key_id,
        bill_to=ctx.bill_to,
        kept=_kept(ctx, completion),
        request_id=request_id,
    )
    # Observed once the request is recorded: counters in this process, spans (when tracing is
    # on) handed to the exporter's background thread.
    route_observe(
        workflow=ctx.workflow.slug,
        deployment=winner.slug if winner else "",
        ok=winner is not None,
        latency_ms=latency_ms,
        attempts=ctx.attempts,
    )
    policy_version = ctx.plan.version if ctx.plan.policy_id is not None else None
    spans = tracer()
    if spans is not None:
        route_trace(
            spans,
            workflow=ctx.workflow.slug,
            endpoint=ctx.endpoint,
            started=ctx.started,
            attempts=ctx.attempts,
            winner=winner,
            completion=completion,
            request_id=row.pk,
            cost=row.cost,
            currency=row.currency,
            policy_version=policy_version,
            error=error,
        )
    return RouteResult(
        ok=winner is not None,
        request_id=row.pk,
        deployment_id=winner.deployment_id if winner else None,
        deployment_slug=winner.slug if winner else "",
        completion=completion,
        cost=row.cost,
        currency=row.currency,
        latency_ms=latency_ms,
        ttft_ms=ttft_ms,
        error=error,
        status_code=status_code,
        attempts=ctx.attempts,
        policy_version=policy_version,
        demoted=ctx.demoted,
        retry_after=retry_after,
        cost_avoided=row.cost_avoided,
        refusal=ctx.attempts[-1].refusal if winner is None and ctx.attempts else "",
    )


def _kept(ctx: Context, completion: Completion | None) -> dict[str, Any] | None:
    """The input and answer to keep: only when the caller asked (the gateway, for a workflow that
    opted in) and the request was answered (a replay needs the answer as its reference)."""
    if not ctx.retain or completion is None:
        return None
    request = retained_input(ctx.request)
    if request is None:
        return None
    return {"endpoint": str(ctx.endpoint), "request": request, "response_text": completion.text}


def recorded(client_request_id: str, workflow: Workflow) -> InferenceRequest | None:
    rows = InferenceRequest.objects.select_related("deployment")
    return rows.filter(client_request_id=client_request_id, workflow=workflow).first()


def replay(row: InferenceRequest, *, digest: str | None = None) -> RouteResult:
    """The recorded request's result again (IdempotencyConflict when a /v1 key's answer may not
    be handed out: inference.idempotency.replay_check)."""
    replay_check(row, digest=digest)
    completion = None
    if row.status == InferenceRequest.Status.SUCCEEDED:
        # The whole answer where it was kept (tool calls and all), else its text.
        doc = row.response_doc
        finish = (
            (doc.get("choices") or [{}])[0].get("finish_reason") if isinstance(doc, dict) else None
        ) or "stop"
        completion = Completion(
            text=row.response_text,
            tokens_in=row.tokens_in,
            tokens_out=row.tokens_out,
            finish_reason=finish,
            raw=doc if isinstance(doc, dict) else None,
        )
    status_code, refusal = (None, "") if completion is not None else _failure_replayed(row)
    return RouteResult(
        ok=row.status == InferenceRequest.Status.SUCCEEDED,
        request_id=row.pk,
        deployment_id=row.deployment_id,
        deployment_slug=row.deployment.slug if row.deployment else "",
        completion=completion,
        cost=row.cost,
        currency=row.currency,
        latency_ms=row.latency_ms,
        ttft_ms=row.ttft_ms,
        error=row.error,
        status_code=status_code,
        replayed=True,
        refusal=refusal,
    )


def _failure_replayed(row: InferenceRequest) -> tuple[int | None, str]:
    """A failed request's answer again, from its recorded attempts (the journal entry while it is
    pending, else the attempt rows): what finish_request and raise_refusal made of them the first
    time. A budget's or the cost limit's refusal is raised again (BudgetExhausted,
    CostLimitExceeded); otherwise (status, adapter refusal) of the last failed attempt."""
    pending = row.ledger_pending
    tried: list[tuple[str, int | None, str]]
    if isinstance(pending, dict) and isinstance(pending.get("attempts"), list):
        tried = [(str(a[2]), a[3], str(a[7] or "")) for a in pending["attempts"]]  # FoldJob.journal
    else:
        rows = InferenceAttempt.objects.filter(request=row).order_by("position")
        tried = [(o, s, e) for o, s, e in rows.values_list("outcome", "status_code", "error")]
    budget = [error for outcome, _, error in tried if outcome == Outcome.BUDGET]
    if budget:
        raise BudgetExhausted(budget[-1], budget_id=None)
    called = any(outcome in CALLED for outcome, _, _ in tried)
    over_cost = CostLimitExceeded.recorded([e for o, _, e in tried if o == Outcome.OVER_COST], row.currency)
    if over_cost is not None and not called:
        raise over_cost
    last = next((t for t in reversed(tried) if t[0] != Outcome.OK), None)
    if last is None:
        return None, ""
    outcome, status_code, error = last
    return status_code, refusal_recorded(error) if outcome == Outcome.UNSUPPORTED else ""


def raise_refusal(ctx: Context, winner: PlanEntry | None) -> None:
    """After recording: a request that nothing answered because a budget or the cost limit
    refused every call is the caller's error to see, not an upstream failure."""
    if winner is not None:
        return
    if ctx.budget_error is not None:
        raise ctx.budget_error
    if ctx.cost_error is not None and not any(a.called for a in ctx.attempts):
        raise ctx.cost_error
