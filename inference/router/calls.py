"""Walking the route: breakers, the cost cap, budget admissions, the calls, retries and cooldowns."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

from django.conf import settings
from django.db import connection

from billing.budgets import BudgetExhausted, SpendTarget, budget_admit, budget_settle
from inference.adapters.base import (
    Completion,
    EmbeddingRequest,
    ProviderError,
    StreamChunk,
)
from inference.adapters.registry import adapter_for
from inference.breaker.breakers import breakers, record_success
from inference.breaker.redis_breakers import RedisBreakers
from inference.breaker.state import PeekAsk, breaker_settings, monotonic_now
from inference.models import Endpoint, InferenceAttempt
from inference.recording import AttemptInfo, journal_fold
from inference.router.context import Context, call_target, candidates, cost_estimate, needs_admission
from inference.router.errors import CostLimitExceeded, NoRoute, over_cost_error
from inference.router.policy import Peek
from inference.selectors import (
    GENERATION_KEY,
    PlanEntry,
    deployment_plan,
    generation,
    route_plan_cached,
    route_plan_refresh,
)
from registry.models import Workflow

Outcome = InferenceAttempt.Outcome
_rng = random.Random()  # noqa: S311 (backoff jitter, not security)


def error_attempt(
    position: int, entry: PlanEntry, exc: ProviderError, started: float, now: float
) -> AttemptInfo:
    client_error = exc.client_error
    return AttemptInfo(
        position=position,
        entry=entry,
        outcome=Outcome.RETRYABLE if exc.retryable else Outcome.NON_RETRYABLE,
        status_code=exc.status_code,
        latency_ms=(now - started) * 1000.0,
        error=str(exc)[:1000] + (" [client error]" if client_error else ""),
        started_at=started,
        code=exc.code,
        refusal=exc.refusal,
    )


@dataclass
class Answer:
    entry: PlanEntry
    started: float
    completion: Completion | None = None
    first: StreamChunk | None = None
    chunks: Iterator[StreamChunk] | None = None
    probe: bool = False  # the call was a half-open probe


def hold_admission(ctx: Context, entry: PlanEntry, target: SpendTarget, stack: ExitStack) -> None:
    """Admit a call under the hard budgets of `target`, holding its worst case until its spend
    is in the ledger: the stack settles it after an inline recording; a journaled request hands
    it to its fold (Context.holds). Raises BudgetExhausted.

    A refusal that holds contributed to (requests in flight, or answered and journaled but not
    folded yet, whose worst cases stand in for their real costs) is asked once more after this
    process folds the journal, which puts the real costs in and releases those holds: so a
    budget refuses at its limit rather than at the unfolded worst cases, and only a request near
    the limit pays for a fold."""
    estimate = cost_estimate(entry, ctx.request, batch=ctx.endpoint == Endpoint.BATCH)
    try:
        admission = budget_admit(
            estimate=estimate, target=target, currency=entry.currency, cached_budgets=True
        )
    except BudgetExhausted as exc:
        if not exc.reserved or connection.in_atomic_block:
            raise
        journal_fold()
        admission = budget_admit(
            estimate=estimate, target=target, currency=entry.currency, cached_budgets=True
        )
    stack.callback(budget_settle, admission=admission)
    ctx.holds.append(admission)


def route_peek_ask(workflow: Workflow) -> PeekAsk | None:
    """What `attempt_calls` will read first, for another script's call to read instead (the
    gateway's rate-limit check: inference.ratelimit.limits.RateCheck): the route-cache generation
    and the breakers of every deployment of the workflow's cached plan. None without shared
    breakers or a cached plan (the router then peeks as usual)."""
    if not isinstance(breakers(), RedisBreakers):
        return None
    plan = route_plan_cached(workflow_id=workflow.pk)
    if plan is None or not plan.entries:
        return None
    return PeekAsk(
        generation_key=GENERATION_KEY,
        deployment_ids=tuple(e.deployment_id for e in plan.entries),
        now=monotonic_now(),
        cooldown_s=breaker_settings().cooldown_s,
    )


def attempt_calls(ctx: Context, stack: ExitStack, *, stream: bool) -> Iterator[Answer]:
    """Walk the route, yielding (entry, answer) for each successful call.

    The caller stops iterating once it accepts an answer (a Completion, or a stream whose first
    chunk arrived); anything else it records as an attempt and iteration goes on.
    """
    cfg = breaker_settings()
    store = breakers()
    gen = generation()
    # One Redis round trip answers both "is the cached plan current?" and "which circuits are
    # open?"; a moved generation (a switch, a price, a chaos drill) rebuilds the plan first.
    # The gateway's rate-limit call may have read both already (ctx.peeked, route_peek_ask).
    order = candidates(ctx)
    ids = [e.deployment_id for e in order]
    peeked, ctx.peeked = ctx.peeked, None
    if peeked is not None and all(i in peeked.states for i in ids):
        current, states = peeked.generation, [peeked.states[i] for i in ids]
    elif isinstance(store, RedisBreakers):
        current, states = store.peek_with_generation(GENERATION_KEY, ids, now=monotonic_now(), cfg=cfg)
    else:
        current, states = gen.read(), store.peek(ids, now=monotonic_now(), cfg=cfg)
    if not ctx.plan.is_current(current, shared=gen.shared):
        if ctx.deployment is not None:
            plan = deployment_plan(workflow_id=ctx.workflow.pk, deployment_id=ctx.deployment.pk)
        else:
            plan = route_plan_refresh(workflow_id=ctx.workflow.pk, generation_value=current)
        if plan is None or not plan.entries:
            raise NoRoute(f"workflow {ctx.workflow.slug} has no usable routing policy")
        ctx.plan = plan
        ctx.attempts.clear()
        order = candidates(ctx)
        ids = [e.deployment_id for e in order]
        states = store.peek(ids, now=monotonic_now(), cfg=cfg)
    refused_by: set[int] = set()
    max_rounds = settings.INFERENCE_MAX_ROUNDS
    backoff = settings.INFERENCE_BACKOFF_SECONDS
    for round_no in range(max_rounds):
        if round_no:
            # Full-jitter exponential backoff (AWS Architecture Blog, "Exponential Backoff And
            # Jitter", 2015), never past the deadline.
            remaining = ctx.deadline - time.perf_counter()
            pause = min(remaining, _rng.uniform(0, backoff * (2**round_no)))
            if pause > 0:
                time.sleep(pause)
            states = store.peek(ids, now=monotonic_now(), cfg=cfg)
        any_called = False
        for entry, state in zip(order, states, strict=True):
            if time.perf_counter() >= ctx.deadline:
                return
            if entry.deployment_id in refused_by:
                continue  # it answered a non-retryable error earlier in this request
            if state == Peek.OPEN or (
                state == Peek.HALF_OPEN
                and not store.claim_probe(entry.deployment_id, now=monotonic_now(), cfg=cfg)
            ):
                ctx.attempts.append(
                    AttemptInfo(
                        position=len(ctx.attempts),
                        entry=entry,
                        outcome=Outcome.CIRCUIT_OPEN,
                        status_code=None,
                        latency_ms=0.0,
                        error="circuit open",
                    )
                )
                continue
            limit = ctx.plan.max_cost_per_request
            if limit is not None:
                estimate = cost_estimate(entry, ctx.request, batch=ctx.endpoint == Endpoint.BATCH)
                if estimate > limit:
                    if ctx.cost_error is None or estimate < ctx.cost_error.estimate:
                        ctx.cost_error = CostLimitExceeded(
                            estimate=estimate, limit=limit, currency=entry.currency
                        )
                    ctx.attempts.append(
                        AttemptInfo(
                            position=len(ctx.attempts),
                            entry=entry,
                            outcome=Outcome.OVER_COST,
                            status_code=None,
                            latency_ms=0.0,
                            error=over_cost_error(estimate, limit),
                        )
                    )
                    continue
            try:
                target = call_target(ctx, entry)
                if needs_admission(ctx, target):
                    hold_admission(ctx, entry, target, stack)
            except BudgetExhausted as exc:
                ctx.budget_error = exc
                ctx.attempts.append(
                    AttemptInfo(
                        position=len(ctx.attempts),
                        entry=entry,
                        outcome=Outcome.BUDGET,
                        status_code=402,
                        latency_ms=0.0,
                        error=str(exc)[:1000],
                    )
                )
                # A provider- or cluster-scoped budget may leave room on another provider; a
                # workflow budget refuses them all. Either way nothing is spent past a limit.
                continue
            any_called = True
            adapter = adapter_for(entry.target)
            call_started = time.perf_counter()
            timeout = max(0.001, ctx.deadline - call_started)
            try:
                if isinstance(ctx.request, EmbeddingRequest):
                    answer = adapter.embed(entry.target, ctx.request, timeout=timeout)
                    yield Answer(entry, call_started, completion=answer, probe=state == Peek.HALF_OPEN)
                elif stream:
                    chunks = adapter.stream(entry.target, ctx.request, timeout=timeout)
                    first = next(iter(chunks), None)
                    yield Answer(
                        entry, call_started, first=first, chunks=chunks, probe=state == Peek.HALF_OPEN
                    )
                else:
                    answer = adapter.complete(entry.target, ctx.request, timeout=timeout)
                    yield Answer(entry, call_started, completion=answer, probe=state == Peek.HALF_OPEN)
                return
            except ProviderError as exc:
                now = time.perf_counter()
                if exc.refusal:
                    # The adapter refused before calling: the request asks for what this
                    # deployment's wire format cannot carry (a field, a text completion). Another
                    # deployment may take it, and it says nothing about this one's health: skipped
                    # as a deployment without a capability the request needs is (no breaker
                    # verdict, no failover event; a claimed probe frees itself after cooldown).
                    ctx.attempts.append(
                        AttemptInfo(
                            position=len(ctx.attempts),
                            entry=entry,
                            outcome=Outcome.UNSUPPORTED,
                            status_code=exc.status_code,
                            latency_ms=(now - call_started) * 1000.0,
                            error=str(exc)[:1000],
                            refusal=exc.refusal,
                        )
                    )
                    refused_by.add(entry.deployment_id)
                    continue
                attempt = error_attempt(len(ctx.attempts), entry, exc, call_started, now)
                ctx.attempts.append(attempt)
                if exc.client_error:
                    # The request itself is at fault (the provider answered 400/413/422): no other
                    # deployment would take it, and it says nothing about this one's health, so
                    # its breaker does not count it (nor does a failover event follow).
                    if state == Peek.HALF_OPEN:
                        _, transition = store.record(
                            entry.deployment_id,
                            ok=True,
                            latency_ms=attempt.latency_ms,
                            now=monotonic_now(),
                            cfg=cfg,
                        )
                        if transition:
                            ctx.breaker_transitions.append((entry.deployment_id, transition, ""))
                    return
                _, transition = store.record(
                    entry.deployment_id,
                    ok=False,
                    latency_ms=attempt.latency_ms,
                    now=monotonic_now(),
                    cfg=cfg,
                )
                if transition:
                    ctx.breaker_transitions.append((entry.deployment_id, transition, attempt.code))
                if exc.retry_after is not None and exc.retryable:
                    # The provider said how long to stay away (429/503 Retry-After): every
                    # process skips this deployment for that long (capped), and the route
                    # moves on to the next one now.
                    wait = min(exc.retry_after, settings.INFERENCE_MAX_RETRY_AFTER_SECONDS)
                    store.cool_down(entry.deployment_id, until=monotonic_now() + wait)
                if not exc.retryable:
                    refused_by.add(entry.deployment_id)
        retryable_left = any(a.outcome == Outcome.RETRYABLE for a in ctx.attempts)
        if not any_called or not retryable_left:
            return


def ok_attempt(
    ctx: Context, entry: PlanEntry, started: float, completion: Completion, *, probe: bool
) -> AttemptInfo:
    latency = (time.perf_counter() - started) * 1000.0
    attempt = AttemptInfo(
        position=len(ctx.attempts),
        entry=entry,
        outcome=Outcome.OK,
        status_code=completion.status_code,
        latency_ms=latency,
        tokens_in=completion.tokens_in,
        tokens_out=completion.tokens_out,
        cached_tokens=completion.cached_tokens,
        cache_write_tokens=completion.cache_write_tokens,
        reasoning_tokens=completion.reasoning_tokens,
        started_at=started,
        batch=ctx.endpoint == Endpoint.BATCH,
    )
    ctx.attempts.append(attempt)
    transition = record_success(entry.deployment_id, latency_ms=latency, probe=probe, cfg=breaker_settings())
    if transition:
        ctx.breaker_transitions.append((entry.deployment_id, transition, ""))
    return attempt
