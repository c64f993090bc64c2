"""The entry points: route (one answer) and route_stream (a stream, recorded when it ends)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack

import numpy as np
from django.db import IntegrityError

from billing.budgets import BudgetExhausted
from billing.services import NoPriceError
from inference.adapters.base import (
    Completion,
    EmbeddingRequest,
    InferenceInput,
    ProviderError,
    RoutedInput,
    StreamChunk,
)
from inference.admission import input_tokens
from inference.breaker.state import PeekAnswer
from inference.cache import (
    CacheAsk,
    CachedAnswer,
    SemanticAsk,
    cache_get,
    cache_key,
    cache_put,
    cache_seconds,
    embedding_vector,
    semantic_ask,
    semantic_discard,
    semantic_lookup,
    semantic_on,
    semantic_put,
)
from inference.models import Endpoint, InferenceAttempt
from inference.recording import AttemptInfo
from inference.recording.record import request_id_reserve
from inference.router.calls import attempt_calls, ok_attempt
from inference.router.context import Context, prepare
from inference.router.errors import CapabilityMissing, CostLimitExceeded, NoRoute, RouteResult
from inference.router.finish import finish_request, raise_refusal, recorded, replay
from inference.selectors import (
    PlanEntry,
)
from registry.models import Deployment, Workflow

Outcome = InferenceAttempt.Outcome
logger = logging.getLogger(__name__)
EMBEDDING_DEADLINE_S = 5.0  # the longest a semantic-cache lookup waits for its embedding


def route(
    *,
    workflow: Workflow,
    request: RoutedInput,
    endpoint: str = Endpoint.CHAT,
    client_request_id: str | None = None,
    deadline_s: float | None = None,
    deployment: Deployment | None = None,
    api_key_id: int | None = None,
    bill_to: str = "",
    retain: bool = False,
    request_digest: str | None = None,
    cache: CacheAsk | None = None,
    peeked: PeekAnswer | None = None,
) -> RouteResult:
    """Serve `request` for `workflow` by its current policy version (see the module docstring).

    With `deployment`, call that deployment only (no strategy, no fallback; breakers, budgets,
    retries and records as usual): eval runs and judges score one deployment at a time. The
    request is recorded under `workflow` with no policy version. `api_key_id`: the API key the
    request came with; its budgets are asked and its ledger rows name it. `bill_to`: a ledger
    subject "<type>:<id>" the request's usage rows are billed to instead of the request itself
    (an eval run scoring a training run's model version bills the run: "training_run:<id>").
    `retain`: keep the input and answer (the gateway, for a workflow that opted in:
    inference.retention); for a /v1 Idempotency-Key it also keeps the answer for the replay
    window. `request_digest`: the /v1 body's hash, which a retry with the same key must match
    (inference.idempotency; IdempotencyConflict otherwise). `cache`: the gateway's API and body
    of a request the workflow's response cache may answer (inference.cache): a hit is recorded
    at no cost with the cost it avoided; an answer bought here is cached for the next one.
    `peeked`: the generation and breakers the gateway's rate-limit call read (RateCheck.peeked).
    """
    if client_request_id:
        # A replay answers only inside the key's own scope: the key names its namespace
        # (inference.idempotency) and the recorded request must be this workflow's.
        row = recorded(client_request_id, workflow)
        if row is not None:
            return replay(row, digest=request_digest)
    ctx = prepare(
        workflow, request, endpoint, deadline_s, deployment=deployment, api_key_id=api_key_id, retain=retain
    )
    ctx.bill_to = bill_to
    ctx.request_digest = request_digest or ""
    ctx.peeked = peeked
    key = None
    semantic: SemanticAsk | None = None
    vector: np.ndarray | None = None
    if cache is not None and cache_seconds(workflow):
        key = cache_key(cache, workflow=workflow, policy_id=ctx.plan.policy_id)
        hit = cache_get(workflow, key)
        answered = _cached_answer(ctx, hit) if hit is not None else None
        if answered is not None:
            return answered
        semantic = semantic_ask(cache) if semantic_on(workflow) else None
        vector = _prompt_embedding(ctx, semantic) if semantic is not None else None
        answered = _semantic_answer(ctx, semantic, vector) if semantic and vector is not None else None
        if answered is not None:
            return answered
    completion: Completion | None = None
    winner: PlanEntry | None = None
    with ExitStack() as stack:
        for answer in attempt_calls(ctx, stack, stream=False):
            if answer.completion is not None:
                ok_attempt(ctx, answer.entry, answer.started, answer.completion, probe=answer.probe)
                completion, winner = answer.completion, answer.entry
            break
        # Settle the budget admissions only after the ledger has the real cost.
        try:
            result = finish_request(
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
            row = recorded(client_request_id, workflow)
            if row is None:
                raise
            return replay(row, digest=request_digest)
    raise_refusal(ctx, winner)
    if key is not None and winner is not None and completion is not None and not result.replayed:
        cache_put(
            workflow,
            key,
            CachedAnswer(winner.deployment_id, result.cost, result.currency, completion, time.time()),
        )
        if semantic is not None and vector is not None:
            semantic_put(workflow, ctx.plan.policy_id, semantic, vector, key)
    return result


def _prompt_embedding(ctx: Context, ask: SemanticAsk) -> np.ndarray | None:
    """The prompt's embedding from the workflow's embeddings deployment, asked as a request of
    its own (recorded and billed like any; the caller's key and budgets apply), or None: a
    refusal or a failed call is a miss, never the caller's error."""
    workflow = ctx.workflow
    embedder = workflow.semantic_cache_deployment
    if embedder is None:
        return None
    # A slow embedder may take a quarter of what is left of the request's deadline (at most
    # EMBEDDING_DEADLINE_S), never the time its answer needs.
    left = ctx.deadline - time.perf_counter()
    if left <= 0:
        return None
    try:
        result = route(
            workflow=workflow,
            request=EmbeddingRequest(texts=(ask.text,)),
            endpoint=Endpoint.EMBEDDING,
            deployment=embedder,
            api_key_id=ctx.api_key_id,
            bill_to=ctx.bill_to,
            deadline_s=min(EMBEDDING_DEADLINE_S, left / 4),
        )
    except (BudgetExhausted, CostLimitExceeded, CapabilityMissing, NoRoute, NoPriceError) as exc:
        logger.warning("semantic cache of %s: prompt not embedded (%s)", workflow.slug, exc)
        return None
    vector = embedding_vector(result.completion.raw) if result.ok and result.completion is not None else None
    if vector is None:
        logger.warning("semantic cache of %s: no embedding (%s)", workflow.slug, result.error or "unusable")
    return vector


def _semantic_answer(ctx: Context, ask: SemanticAsk, vector: np.ndarray) -> RouteResult | None:
    """The cached answer of the most similar prompt at or above the threshold, recorded as a
    cache hit (_cached_answer) with its similarity; an embedding whose answer is gone is dropped."""
    for match in semantic_lookup(ctx.workflow, ctx.plan.policy_id, ask, vector):
        hit = cache_get(ctx.workflow, match.key)
        if hit is None:
            semantic_discard(ctx.workflow, ctx.plan.policy_id, ask, match.key)
            continue
        answered = _cached_answer(ctx, hit)
        if answered is not None:
            answered.cache_similarity = match.similarity
            return answered
    return None


def _cached_answer(ctx: Context, hit: CachedAnswer) -> RouteResult | None:
    """Record a cache hit as a request of the deployment that gave the answer, at no cost; None
    (a miss) when that deployment is no longer in the route."""
    entry = next((e for e in ctx.plan.entries if e.deployment_id == hit.deployment_id), None)
    if entry is None:
        return None
    c = hit.completion
    attempt = AttemptInfo(
        position=0,
        entry=entry,
        outcome=Outcome.OK,
        status_code=c.status_code,
        latency_ms=(time.perf_counter() - ctx.started) * 1000.0,
        tokens_in=c.tokens_in,
        tokens_out=c.tokens_out,
        cached_tokens=c.cached_tokens,
        cache_write_tokens=c.cache_write_tokens,
        reasoning_tokens=c.reasoning_tokens,
        started_at=ctx.started,
        cost_avoided=hit.cost,
    )
    ctx.attempts.append(attempt)
    return finish_request(ctx, completion=c, winner=entry, stream=False, ttft_ms=None, client_request_id=None)


class RouteStream:
    """A streamed answer: the deployment is chosen (first chunk received) before iteration.

    Iterate for the chunks; the request is recorded when the stream ends, fails or is closed.
    """

    def __init__(self, ctx: Context, stack: ExitStack) -> None:
        self._ctx = ctx
        self._stack = stack
        self.result: RouteResult | None = None
        # The provider's stream broke after the first chunk (billed as far as it went; no
        # failover once bytes went out): a translated API tells its client it failed.
        self.broken = False
        self.winner: PlanEntry | None = None
        self._first: StreamChunk | None = None
        self._chunks: Iterator[StreamChunk] | None = None
        self._call_started = 0.0
        self._probe = False
        self.ttft_ms: float | None = None
        self.request_id: int | None = None  # reserved once a deployment answers

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
                # granularity of OpenAI-compatible streams) and the input as admission did
                # (the whole request: messages, parts, tools, template).
                if usage is None or usage.tokens_in is None:
                    usage = StreamChunk(text="", tokens_in=input_tokens(ctx.request), tokens_out=pieces)
                completion = Completion(
                    text="".join(texts),
                    tokens_in=usage.tokens_in or 0,
                    tokens_out=usage.tokens_out or 0,
                    finish_reason=finish,
                    cached_tokens=usage.cached_tokens,
                    cache_write_tokens=usage.cache_write_tokens,
                    reasoning_tokens=usage.reasoning_tokens,
                )
                attempt = ok_attempt(ctx, winner, self._call_started, completion, probe=self._probe)
                if failure is not None:
                    # The stream broke after the client got part of it: bill what was sent,
                    # and say so; no failover is possible once bytes went out.
                    attempt.error = f"stream broke after {pieces} pieces: {failure}"
                    self.broken = True
            self.result = finish_request(
                ctx,
                completion=completion,
                winner=winner,
                stream=True,
                ttft_ms=self.ttft_ms,
                client_request_id=None,
                request_id=self.request_id,
            )
        finally:
            self._stack.close()


def route_stream(
    *,
    workflow: Workflow,
    request: InferenceInput,
    endpoint: str = Endpoint.CHAT,
    deadline_s: float | None = None,
    api_key_id: int | None = None,
    retain: bool = False,
    peeked: PeekAnswer | None = None,
) -> RouteStream:
    """Choose a deployment by receiving its first chunk (failing over until one answers).

    When none answers, the request is recorded at once and the stream's `ok` is False (its
    `result` says why); BudgetExhausted is raised as in `route`.
    """
    ctx = prepare(workflow, request, endpoint, deadline_s, api_key_id=api_key_id, retain=retain)
    ctx.peeked = peeked
    stack = ExitStack()
    out = RouteStream(ctx, stack)
    try:
        for answer in attempt_calls(ctx, stack, stream=True):
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
        raise_refusal(ctx, None)
    # The id the request will be recorded under when the stream ends: every chunk names it.
    try:
        out.request_id = request_id_reserve()
    except BaseException:
        stack.close()  # the provider's stream, already open (the database may be down)
        raise
    return out
