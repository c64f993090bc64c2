"""The router: executes a workflow's current routing-policy version.

The order to try comes from the routing core (inference.routing, pure) over the plan that
inference.selectors loads and caches; this module makes the calls (adapters), keeps the
circuit breakers (inference.breaker), asks the budgets, retries, and has every attempt recorded
(inference.services).

Public entry points (used by the gateway, the eval runner and batch jobs):

    route(*, workflow, request, endpoint=Endpoint.CHAT, client_request_id=None, deadline_s=None,
          deployment=None) -> RouteResult     (deployment: call only that one, e.g. for evals)
    route_stream(*, workflow, request, endpoint=Endpoint.CHAT, deadline_s=None) -> RouteStream
        (iterate it for StreamChunk; .result once exhausted or closed)

Both record one InferenceRequest with every attempt, a UsageRecord per billed attempt and a
FailoverEvent per failed call that led to another (inference.services.inference_request_record).
A request that fails on every deployment comes back with ok=False (recorded as failed);
BudgetExhausted is raised (after recording) when a hard budget of the spend is exhausted;
NoRoute when the workflow has no usable policy. With a client_request_id seen before, the stored
result is returned and nothing is called or billed again.

How a request moves along the route:
- the strategy orders the deployments (inference.routing.order_candidates); a deployment whose
  rolling quality is below the policy's floor is skipped;
- a deployment whose circuit is open is skipped; after its cooldown one request probes it;
- before each call the budget is asked (billing.budgets.budget_admission) when a hard-limit
  budget covers the spend; a refused call is not made (fail closed), and the route goes on only
  where another budget scope leaves room (another provider or cluster);
- a retryable error (connect error, timeout, 429, 5xx, malformed answer) moves on to the next
  deployment at once; when every deployment failed, the whole route is retried after a jittered
  exponential backoff while the deadline allows (at most INFERENCE_MAX_ROUNDS rounds);
- a non-retryable error caused by the request itself (400, 413, 422) stops at once; other 4xx
  (bad key, unknown model: the deployment's fault) move on without a retry of that deployment.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError

from billing.budgets import BudgetExhausted, budget_admission, spend_target
from inference.adapters.base import (
    CLIENT_ERROR_STATUSES,
    ChatRequest,
    Completion,
    CompletionRequest,
    EmbeddingRequest,
    InferenceInput,
    ProviderError,
    RoutedInput,
    StreamChunk,
    request_features,
)
from inference.adapters.registry import adapter_for
from inference.breaker import RedisBreakers, breaker_settings, breakers, monotonic_now, record_success
from inference.models import Endpoint, InferenceAttempt, InferenceRequest
from inference.routing import Peek, order_candidates
from inference.selectors import (
    GENERATION_KEY,
    PlanEntry,
    RoutePlan,
    deployment_plan,
    generation,
    rolling_p50,
    rolling_quality,
    route_plan,
    route_plan_cached,
    route_plan_refresh,
)
from inference.services import AttemptInfo, inference_request_record
from stack.registry.models import Deployment, Workflow

Outcome = InferenceAttempt.Outcome
CLIENT_ERRORS = CLIENT_ERROR_STATUSES  # the request's fault: no retry, no failover, no breaker
_rng = random.Random()  # noqa: S311 (backoff jitter, not security)


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


# --- Helpers ----------------------------------------------------------------------------------------


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


def _estimate(entry: PlanEntry, request: RoutedInput) -> Decimal:
    """A rough upper estimate of the call's cost, for the budget's reservation."""
    if isinstance(request, ChatRequest):
        chars = sum(len(m.content) for m in request.messages)
    else:
        chars = len(request.prompt)
    tokens_in = Decimal(chars // 4 + 1)
    if isinstance(request, EmbeddingRequest):
        tokens_out = Decimal(0)
    else:
        tokens_out = Decimal(request.max_tokens or 256) * request.n
    million = Decimal(1_000_000)
    return (tokens_in * (entry.input_price or 0) + tokens_out * (entry.output_price or 0)) / million


def _needs_admission(ctx: _Context, entry: PlanEntry) -> bool:
    """Only a spend under some active hard-limit budget needs admission (the others would be
    admitted without a reservation); the plan knows those budgets' targets."""
    hard = ctx.plan.hard_budget_keys
    if not hard:
        return False
    keys = spend_target(workflow=ctx.workflow, provider=entry.deployment.provider).keys()
    return any(key in hard for key in keys)


def _error_attempt(
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
    )


@dataclass
class _Context:
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
    deployment: Deployment | None = None  # a one-deployment call: route(deployment=...)


def _prepare(
    workflow: Workflow,
    request: RoutedInput,
    endpoint: str,
    deadline_s: float | None,
    *,
    deployment: Deployment | None = None,
) -> _Context:
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
    deadline_s = deadline_s if deadline_s is not None else _setting("INFERENCE_DEADLINE_SECONDS", 30.0)
    return _Context(
        workflow=workflow,
        plan=plan,
        request=request,
        endpoint=endpoint,
        started=started,
        deadline=started + deadline_s,
        deployment=deployment,
    )


def _candidates(ctx: _Context) -> list[PlanEntry]:
    """The plan's entries in the order its policy gives (inference.routing); the ones demoted
    for quality are recorded as skipped attempts."""
    plan = ctx.plan
    policy = plan.policy
    ids = [e.deployment_id for e in plan.entries]
    quality = (
        rolling_quality(workflow_id=plan.workflow_id, deployment_ids=ids) if policy.needs_quality else {}
    )
    p50s = rolling_p50(deployment_ids=ids) if policy.needs_latency else {}
    order, demoted = order_candidates(policy, plan.entries, quality=quality, p50s=p50s)
    order = _capable(ctx, order)
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


def _context_tokens(request: RoutedInput) -> int:
    """A rough count of the tokens the request occupies (prompt characters / 4 plus max_tokens)."""
    if isinstance(request, ChatRequest):
        chars = sum(len(m.content) for m in request.messages)
    else:
        chars = len(request.prompt)
    return chars // 4 + 1 + (request.max_tokens or 0)


def _capable(ctx: _Context, order: list[PlanEntry]) -> list[PlanEntry]:
    """The deployments that can serve the request's features; the others are recorded as
    skipped. A fallback without tool support must not answer a tool request in plain text."""
    needed = request_features(ctx.request)
    limited = any(e.max_context_tokens is not None for e in order)
    if not needed and not limited:
        return order
    context = _context_tokens(ctx.request) if limited else 0
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


@dataclass
class _Answer:
    entry: PlanEntry
    started: float
    completion: Completion | None = None
    first: StreamChunk | None = None
    chunks: Iterator[StreamChunk] | None = None
    probe: bool = False  # the call was a half-open probe


def _attempt_calls(ctx: _Context, stack: ExitStack, *, stream: bool) -> Iterator[_Answer]:
    """Walk the route, yielding (entry, answer) for each successful call.

    The caller stops iterating once it accepts an answer (a Completion, or a stream whose first
    chunk arrived); anything else it records as an attempt and iteration goes on.
    """
    cfg = breaker_settings()
    store = breakers()
    gen = generation()
    # One Redis round trip answers both "is the cached plan current?" and "which circuits are
    # open?"; a moved generation (a switch, a price, a chaos drill) rebuilds the plan first.
    order = _candidates(ctx)
    ids = [e.deployment_id for e in order]
    if isinstance(store, RedisBreakers):
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
        order = _candidates(ctx)
        ids = [e.deployment_id for e in order]
        states = store.peek(ids, now=monotonic_now(), cfg=cfg)
    refused_by: set[int] = set()
    max_rounds = int(_setting("INFERENCE_MAX_ROUNDS", 2))
    backoff = _setting("INFERENCE_BACKOFF_SECONDS", 0.05)
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
                estimate = _estimate(entry, ctx.request)
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
                            error=f"estimated cost {estimate:.9f} over max_cost_per_request {limit:f}",
                        )
                    )
                    continue
            try:
                if _needs_admission(ctx, entry):
                    stack.enter_context(
                        budget_admission(
                            estimate=_estimate(entry, ctx.request),
                            workflow=ctx.workflow,
                            provider=entry.deployment.provider,
                            currency=entry.currency,
                        )
                    )
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
                    yield _Answer(entry, call_started, completion=answer, probe=state == Peek.HALF_OPEN)
                elif stream:
                    chunks = adapter.stream(entry.target, ctx.request, timeout=timeout)
                    first = next(iter(chunks), None)
                    yield _Answer(
                        entry, call_started, first=first, chunks=chunks, probe=state == Peek.HALF_OPEN
                    )
                else:
                    answer = adapter.complete(entry.target, ctx.request, timeout=timeout)
                    yield _Answer(entry, call_started, completion=answer, probe=state == Peek.HALF_OPEN)
                return
            except ProviderError as exc:
                now = time.perf_counter()
                attempt = _error_attempt(len(ctx.attempts), entry, exc, call_started, now)
                ctx.attempts.append(attempt)
                if exc.client_error:
                    # The request itself is at fault (the provider answered 400/413/422): no other
                    # deployment would take it, and it says nothing about this one's health, so
                    # its breaker does not count it (nor does a failover event follow).
                    if state == Peek.HALF_OPEN:
                        store.record(
                            entry.deployment_id,
                            ok=True,
                            latency_ms=attempt.latency_ms,
                            now=monotonic_now(),
                            cfg=cfg,
                        )
                    return
                store.record(
                    entry.deployment_id,
                    ok=False,
                    latency_ms=attempt.latency_ms,
                    now=monotonic_now(),
                    cfg=cfg,
                )
                if exc.retry_after is not None and exc.retryable:
                    # The provider said how long to stay away (429/503 Retry-After): every
                    # process skips this deployment for that long (capped), and the route
                    # moves on to the next one now.
                    wait = min(exc.retry_after, _setting("INFERENCE_MAX_RETRY_AFTER_SECONDS", 300.0))
                    store.cool_down(entry.deployment_id, until=monotonic_now() + wait)
                if not exc.retryable:
                    refused_by.add(entry.deployment_id)
        retryable_left = any(a.outcome == Outcome.RETRYABLE for a in ctx.attempts)
        if not any_called or not retryable_left:
            return


def _ok_attempt(
    ctx: _Context, entry: PlanEntry, started: float, completion: Completion, *, probe: bool
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
        reasoning_tokens=completion.reasoning_tokens,
        started_at=started,
    )
    ctx.attempts.append(attempt)
    record_success(entry.deployment_id, latency_ms=latency, probe=probe, cfg=breaker_settings())
    return attempt


def _finish(
    ctx: _Context,
    *,
    completion: Completion | None,
    winner: PlanEntry | None,
    stream: bool,
    ttft_ms: float | None,
    client_request_id: str | None,
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
        response_text=completion.text if (completion is not None and client_request_id) else "",
        demoted=ctx.demoted,
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
        policy_version=ctx.plan.version if ctx.plan.policy_id is not None else None,
        demoted=ctx.demoted,
        retry_after=retry_after,
    )


def _recorded(client_request_id: str, workflow: Workflow) -> InferenceRequest | None:
    rows = InferenceRequest.objects.select_related("deployment")
    return rows.filter(client_request_id=client_request_id, workflow=workflow).first()


def _replay(row: InferenceRequest) -> RouteResult:
    completion = None
    if row.status == InferenceRequest.Status.SUCCEEDED:
        completion = Completion(text=row.response_text, tokens_in=row.tokens_in, tokens_out=row.tokens_out)
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
        replayed=True,
    )


def _raise_refusal(ctx: _Context, winner: PlanEntry | None) -> None:
    """After recording: a request that nothing answered because a budget or the cost limit
    refused every call is the caller's error to see, not an upstream failure."""
    if winner is not None:
        return
    if ctx.budget_error is not None:
        raise ctx.budget_error
    if ctx.cost_error is not None and not any(a.called for a in ctx.attempts):
        raise ctx.cost_error


# --- Entry points -------------------------------------------------------------------------------------


def route(
    *,
    workflow: Workflow,
    request: RoutedInput,
    endpoint: str = Endpoint.CHAT,
    client_request_id: str | None = None,
    deadline_s: float | None = None,
    deployment: Deployment | None = None,
) -> RouteResult:
    """Serve `request` for `workflow` by its current policy version (see the module docstring).

    With `deployment`, call that deployment only (no strategy, no fallback; breakers, budgets,
    retries and records as usual): eval runs and judges score one deployment at a time. The
    request is recorded under `workflow` with no policy version.
    """
    if client_request_id:
        # A replay answers only inside the key's own scope: the key names its namespace
        # (inference.idempotency) and the recorded request must be this workflow's.
        row = _recorded(client_request_id, workflow)
        if row is not None:
            return _replay(row)
    ctx = _prepare(workflow, request, endpoint, deadline_s, deployment=deployment)
    completion: Completion | None = None
    winner: PlanEntry | None = None
    with ExitStack() as stack:
        for answer in _attempt_calls(ctx, stack, stream=False):
            if answer.completion is not None:
                _ok_attempt(ctx, answer.entry, answer.started, answer.completion, probe=answer.probe)
                completion, winner = answer.completion, answer.entry
            break
        # Settle the budget admissions only after the ledger has the real cost.
        try:
            result = _finish(
                ctx,
                completion=completion,
                winner=winner,
                stream=False,
                ttft_ms=None,
                client_request_id=client_request_id,
            )
        except IntegrityError:
            # A concurrent retry with the same client_request_id was recorded first: this answer
            # is dropped unbilled (its rows rolled back) and the recorded one is returned.
            if not client_request_id:
                raise
            row = _recorded(client_request_id, workflow)
            if row is None:
                raise
            return _replay(row)
    _raise_refusal(ctx, winner)
    return result


class RouteStream:
    """A streamed answer: the deployment is chosen (first chunk received) before iteration.

    Iterate for the chunks; the request is recorded when the stream ends, fails or is closed.
    """

    def __init__(self, ctx: _Context, stack: ExitStack) -> None:
        self._ctx = ctx
        self._stack = stack
        self.result: RouteResult | None = None
        self.winner: PlanEntry | None = None
        self._first: StreamChunk | None = None
        self._chunks: Iterator[StreamChunk] | None = None
        self._call_started = 0.0
        self._probe = False
        self.ttft_ms: float | None = None

    @property
    def ok(self) -> bool:
        return self.winner is not None

    @property
    def deployment_slug(self) -> str:
        return self.winner.slug if self.winner else ""

    def __iter__(self) -> Iterator[StreamChunk]:
        texts: list[str] = []
        usage: StreamChunk | None = None
        finish = "stop"
        pieces = 0
        status_error: ProviderError | None = None
        try:
            if self.winner is None or self._chunks is None:
                return
            chunk: StreamChunk | None = self._first
            iterator = iter(self._chunks)
            while chunk is not None:
                if chunk.text:
                    texts.append(chunk.text)
                    pieces += 1
                if chunk.tokens_in is not None:
                    usage = chunk
                if chunk.finish_reason:
                    finish = chunk.finish_reason
                yield chunk
                try:
                    chunk = next(iterator, None)
                except ProviderError as exc:
                    status_error = exc
                    break
        finally:
            self._close(texts, usage, pieces, finish, status_error)

    def _close(
        self,
        texts: list[str],
        usage: StreamChunk | None,
        pieces: int,
        finish: str,
        failure: ProviderError | None,
    ) -> None:
        if self.result is not None:
            return
        ctx = self._ctx
        completion = None
        winner = self.winner
        try:
            if winner is not None:
                # Providers that send no usage: count the pieces (one token each, the usual
                # granularity of OpenAI-compatible streams) and the prompt as bytes/4.
                if usage is None or usage.tokens_in is None:
                    prompt = ctx.request.prompt if isinstance(ctx.request, CompletionRequest) else ""
                    if isinstance(ctx.request, ChatRequest):
                        prompt = "".join(m.content for m in ctx.request.messages)
                    usage = StreamChunk(text="", tokens_in=len(prompt.encode()) // 4 + 1, tokens_out=pieces)
                completion = Completion(
                    text="".join(texts),
                    tokens_in=usage.tokens_in or 0,
                    tokens_out=usage.tokens_out or 0,
                    finish_reason=finish,
                    cached_tokens=usage.cached_tokens,
                    reasoning_tokens=usage.reasoning_tokens,
                )
                attempt = _ok_attempt(ctx, winner, self._call_started, completion, probe=self._probe)
                if failure is not None:
                    # The stream broke after the client got part of it: bill what was sent,
                    # and say so; no failover is possible once bytes went out.
                    attempt.error = f"stream broke after {pieces} pieces: {failure}"
            self.result = _finish(
                ctx,
                completion=completion,
                winner=winner,
                stream=True,
                ttft_ms=self.ttft_ms,
                client_request_id=None,
            )
        finally:
            self._stack.close()


def route_stream(
    *,
    workflow: Workflow,
    request: InferenceInput,
    endpoint: str = Endpoint.CHAT,
    deadline_s: float | None = None,
) -> RouteStream:
    """Choose a deployment by receiving its first chunk (failing over until one answers).

    When none answers, the request is recorded at once and the stream's `ok` is False (its
    `result` says why); BudgetExhausted is raised as in `route`.
    """
    ctx = _prepare(workflow, request, endpoint, deadline_s)
    stack = ExitStack()
    out = RouteStream(ctx, stack)
    try:
        for answer in _attempt_calls(ctx, stack, stream=True):
            out.winner = answer.entry
            out._first = answer.first
            out._chunks = answer.chunks
            out._call_started = answer.started
            out._probe = answer.probe
            out.ttft_ms = (time.perf_counter() - ctx.started) * 1000.0
            break
    except BaseException:
        stack.close()
        raise
    if out.winner is None:
        out._close([], None, 0, "stop", None)
        _raise_refusal(ctx, None)
    return out
