"""The OpenAI-compatible gateway: /v1/chat/completions, /v1/completions, /v1/models.

`model` names a workflow; the router picks the deployment. Plain Django views (no DRF) for
speed. Authentication is a Switchyard API token (`Authorization: Bearer sy_...`), optionally
scoped to workflows (ApiToken.workflows). Every answer carries the deployment that served it and
its cost in headers; errors are OpenAI-style bodies ({"error": {"message", "type", "param",
"code"}}), here and, for what happens outside these views under /v1 (size limit, unknown paths,
Django's error pages), in inference.gateway_middleware. Request bodies are checked in one place,
inference.openai_request, before the workflow is looked up or any provider called; what a
provider answered on failure is logged, never returned.

What a token may do comes from stack.registry.access, cached per process only while the
authorisation version in Redis stands (one GET per request), so a revoked token, a removed role
or a deactivated user is refused on the next request; without Redis, every request reads the
token from the database. With that and the workflow row cached, the database work per request in
the steady state is the ledger transaction alone.

Rate limits (inference.ratelimit) are checked after the key, the body and the workflow, before
routing; their x-ratelimit-* headers go on every answer of a request they applied to.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from datetime import UTC
from typing import Any

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from billing.budgets import BudgetExhausted
from billing.services import NoPriceError
from inference.adapters.base import CLIENT_ERROR_STATUSES, Completion, InferenceInput
from inference.idempotency import IdempotencyConflict, caller_key_problem, request_digest, v1_request_id
from inference.models import Endpoint
from inference.openai_request import (
    InvalidRequest,
    chat_request_parse,
    completion_request_parse,
    embedding_request_parse,
    error_document,
    json_document,
)
from inference.ratelimit import RateCheck, RateLimited, StaleGrant, version_check, version_folded
from inference.router import CapabilityMissing, CostLimitExceeded, NoRoute, RouteResult, route, route_stream
from inference.router.context import context_tokens
from stack.registry.access import TokenGrant, cached_grant_unverified, grant_cache_clear, grant_for_raw_token
from stack.registry.models import Workflow

# A workflow's row (its slug and id) is cached this long; who may call it is checked every time.
WORKFLOW_CACHE_SECONDS = 5.0
logger = logging.getLogger(__name__)


class GatewayError(Exception):
    def __init__(self, status: int, message: str, *, type_: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.code = code


def error_response(
    status: int, message: str, type_: str, code: str | None = None, *, param: str | None = None
) -> HttpResponse:
    """An OpenAI-style error answer (every /v1 error goes through here)."""
    body = json.dumps(error_document(message, type_=type_, param=param, code=code))
    response = HttpResponse(body, status=status, content_type="application/json")
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="switchyard"'
    return response


def _method_not_allowed(allowed: str) -> HttpResponse:
    response = error_response(405, f"Use {allowed}", "invalid_request_error", "method_not_allowed")
    response["Allow"] = allowed
    return response


def _invalid(exc: InvalidRequest) -> HttpResponse:
    return error_response(exc.status, str(exc), "invalid_request_error", exc.code, param=exc.param)


# --- Authentication and scope ------------------------------------------------------------------------


def _raw_token(request: HttpRequest) -> str:
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, raw = header.partition(" ")
    raw = raw.strip()
    if scheme.lower() != "bearer" or not raw:
        raise GatewayError(
            401,
            "Missing API key: send Authorization: Bearer <Switchyard API token>",
            type_="invalid_request_error",
            code="invalid_api_key",
        )
    return raw


def _caller(request: HttpRequest) -> TokenGrant:
    """What the bearer token may do (stack.registry.access: cached per process while the
    authorisation version stands, so a revocation counts from the next request)."""
    grant = grant_for_raw_token(_raw_token(request))
    if grant is None:
        raise GatewayError(
            401, "Invalid or revoked API key", type_="invalid_request_error", code="invalid_api_key"
        )
    _not_expired(grant)
    return grant


def _caller_deferred(request: HttpRequest) -> tuple[TokenGrant, bytes | None]:
    """The caller's grant, and the authorisation version still to check it against (None: it
    was checked). A cached grant is taken without the version GET: the rate-limit script call
    reads the version (RateCheck.check(verify=...)), so a request costs one Redis round trip
    for both; a moved version starts the request over (StaleGrant)."""
    raw = _raw_token(request)
    cached = cached_grant_unverified(raw) if version_folded() else None
    if cached is None:
        return _caller(request), None
    if cached.grant.expires_at is not None and cached.grant.expired(timezone.now()):
        version_check(cached.version)  # an expiry changed since: start over
    _not_expired(cached.grant)
    return cached.grant, cached.version


def _not_expired(grant: TokenGrant) -> None:
    if grant.expires_at is not None and grant.expired(timezone.now()):
        raise GatewayError(
            401,
            f"This API key expired at {grant.expires_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC",
            type_="invalid_request_error",
            code="expired_api_key",
        )


_workflows: dict[str, tuple[Workflow, float]] = {}
_cache_lock = threading.Lock()


def gateway_caches_clear() -> None:
    grant_cache_clear()
    with _cache_lock:
        _workflows.clear()


def _not_found(slug: str) -> GatewayError:
    return GatewayError(
        404,
        f"The model (workflow) {slug!r} does not exist",
        type_="invalid_request_error",
        code="model_not_found",
    )


def _workflow(slug: str, caller: TokenGrant) -> Workflow:
    """The workflow named by `model` (its row is cached briefly: who may call it is not). Another
    team's workflow answers as an unknown one: a team key learns nothing of other teams."""
    now = time.monotonic()
    hit = _workflows.get(slug)
    if hit is not None and hit[1] > now:
        workflow = hit[0]
    else:
        found = Workflow.objects.select_related("team").filter(slug=slug).first()
        if found is None:
            raise _not_found(slug)
        workflow = found
        with _cache_lock:
            _workflows[slug] = (workflow, now + WORKFLOW_CACHE_SECONDS)
    if not caller.reaches_team(workflow.team_id):
        raise _not_found(slug)
    return workflow


def _authorize(caller: TokenGrant, workflow: Workflow) -> None:
    if not caller.allows_workflow(workflow.pk, workflow.team_id):
        raise GatewayError(
            403,
            f"This API key may not call workflow {workflow.slug!r}",
            type_="permission_error",
            code="workflow_not_allowed",
        )


# --- Parsing -----------------------------------------------------------------------------------------


def _body(request: HttpRequest) -> dict[str, Any]:
    """The JSON object of the body (inference.openai_request checks shape, Unicode, depth).

    Read with its own limit, SWITCHYARD_V1_MAX_BODY_BYTES, not through `request.body`, whose
    DATA_UPLOAD_MAX_MEMORY_SIZE is the pages' and /api's."""
    limit = settings.V1_MAX_BODY_BYTES
    raw = request.read(limit + 1)
    if len(raw) > limit:
        # Normally refused before the view by GatewayErrorsMiddleware (Content-Length); this is
        # the same answer for a body longer than it said.
        raise InvalidRequest(
            f"The request body is over the limit of {limit} bytes", code="request_too_large", status=413
        )
    return json_document(raw or b"null")


def _idempotency_key(request: HttpRequest) -> str | None:
    """The Idempotency-Key header, checked (a bad one is a 400 before any provider call)."""
    key = request.META.get("HTTP_IDEMPOTENCY_KEY")
    if key is None:
        return None
    problem = caller_key_problem(key)
    if problem is not None:
        raise InvalidRequest(
            f"Idempotency-Key {problem}", param="Idempotency-Key", code="invalid_idempotency_key"
        )
    return key


# --- Responses -----------------------------------------------------------------------------------------


def _headers(
    response: HttpResponse | StreamingHttpResponse,
    result: RouteResult | None,
    slug: str,
    caller: TokenGrant,
    team_id: int | None,
) -> None:
    response["x-switchyard-deployment"] = slug
    if result is not None:
        if caller.sees_costs(team_id):  # money per team: stack.registry.principal
            response["x-switchyard-cost"] = f"{result.cost:f}"
            response["x-switchyard-currency"] = result.currency
        if result.request_id is not None:
            response["x-switchyard-request-id"] = str(result.request_id)
        if result.policy_version is not None:
            response["x-switchyard-policy-version"] = str(result.policy_version)


def _failure(result: RouteResult, caller: TokenGrant, team_id: int | None) -> HttpResponse:
    """Every deployment failed. The caller gets the status class, an OpenAI-style type and the
    request id; what the providers said stays in the logs and the request's attempts (an
    upstream body may name internal hosts or echo another system's data)."""
    logger.warning(
        "v1 request %s failed (last status %s): %s", result.request_id, result.status_code, result.error
    )
    ref = f" (request {result.request_id})" if result.request_id is not None else ""
    if result.status_code in CLIENT_ERROR_STATUSES:
        response = error_response(
            400,
            f"The provider refused the request as invalid{ref}",
            "invalid_request_error",
            "provider_rejected",
        )
    elif result.retry_after is not None:
        # A deployment of the route is cooling down after its provider's 429 and Retry-After:
        # the caller may come back when the first of them takes calls again.
        seconds = max(1, math.ceil(result.retry_after))
        response = error_response(
            429,
            f"Every deployment is rate limited; retry after {seconds} s{ref}",
            "rate_limit_error",
            "rate_limited",
        )
        response["Retry-After"] = str(seconds)
    elif result.status_code == 429:
        response = error_response(
            429, f"Every deployment is rate limited; retry later{ref}", "rate_limit_error", "rate_limited"
        )
    else:
        response = error_response(502, f"No deployment could answer{ref}", "api_error", "upstream_error")
    _headers(response, result, "", caller, team_id)
    return response


_REFUSALS = (
    InvalidRequest,
    RateLimited,
    GatewayError,
    BudgetExhausted,
    CostLimitExceeded,
    CapabilityMissing,
    NoRoute,
    NoPriceError,
    IdempotencyConflict,
)


def _refusal(exc: Exception) -> HttpResponse:
    """The answer to a request refused before or instead of an answer (see _REFUSALS)."""
    if isinstance(exc, InvalidRequest):
        return _invalid(exc)
    if isinstance(exc, GatewayError):
        return error_response(exc.status, str(exc), exc.type, exc.code)
    if isinstance(exc, RateLimited):  # RateCheck.stamp adds Retry-After and the x-ratelimit-* headers
        if exc.status == 503:
            return error_response(503, str(exc), "api_error", "rate_limit_unavailable")
        return error_response(429, str(exc), "rate_limit_error", "rate_limit_exceeded")
    if isinstance(exc, BudgetExhausted):
        return error_response(402, f"Budget exhausted: {exc}", "insufficient_quota", "budget_exhausted")
    if isinstance(exc, CostLimitExceeded):
        return error_response(400, str(exc), "invalid_request_error", "max_cost_exceeded", param="max_tokens")
    if isinstance(exc, CapabilityMissing):
        return error_response(400, str(exc), "invalid_request_error", "unsupported_feature", param=exc.param)
    if isinstance(exc, NoRoute):
        return error_response(503, str(exc), "api_error", "no_route")
    if isinstance(exc, IdempotencyConflict):  # a retry of a used key (inference.idempotency)
        return error_response(
            exc.status, str(exc), "invalid_request_error", exc.code, param="Idempotency-Key"
        )
    # NoPriceError: a price ended between routing and recording. Nothing was recorded (the
    # ledger refuses unpriced usage), so the answer is not handed out unbilled either.
    return error_response(502, f"Pricing changed while answering; retry: {exc}", "api_error", "no_price")


def _synthesized(result: RouteResult, c: Completion, model: str, *, chat: bool) -> dict[str, Any]:
    """An OpenAI answer document for adapters that do not speak OpenAI (Bedrock, replays)."""
    usage = {
        "prompt_tokens": c.tokens_in,
        "completion_tokens": c.tokens_out,
        "total_tokens": c.tokens_in + c.tokens_out,
    }
    if chat:
        return {
            "id": f"chatcmpl-sy{result.request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": c.text},
                    "finish_reason": c.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": usage,
        }
    return {
        "id": f"cmpl-sy{result.request_id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": c.text, "finish_reason": c.finish_reason, "logprobs": None}],
        "usage": usage,
    }


def _complete(request: HttpRequest, *, chat: bool) -> HttpResponse | StreamingHttpResponse:
    if request.method != "POST":
        return _method_not_allowed("POST")
    try:
        limits = RateCheck()
        return limits.stamp(_complete_checked(request, chat=chat, limits=limits, fresh=False))
    except StaleGrant:
        # The cached grant was older than the authorisation version: once more, read afresh.
        limits = RateCheck()
        return limits.stamp(_complete_checked(request, chat=chat, limits=limits, fresh=True))


def _complete_checked(
    request: HttpRequest, *, chat: bool, limits: RateCheck, fresh: bool
) -> HttpResponse | StreamingHttpResponse:
    verify: bytes | None = None  # a cached grant not checked against the version yet
    try:
        if fresh:
            caller = _caller(request)
        else:
            caller, verify = _caller_deferred(request)
        # The whole request is checked before the workflow is looked up or a provider called.
        parse = chat_request_parse if chat else completion_request_parse
        document = _body(request)
        parsed = parse(document)
        key = _idempotency_key(request)
        assert parsed.model is not None  # noqa: S101 (required by the parser)
        workflow = _workflow(parsed.model, caller)
        _authorize(caller, workflow)
        # The caller's key, in the caller's and the workflow's namespace (inference.idempotency).
        client_request_id = (
            v1_request_id(user_id=caller.user_id, workflow_id=workflow.pk, key=key)
            if key is not None
            else None
        )
        payload: InferenceInput = parsed.request
        # Before routing: a refused request reaches no provider and the ledger records nothing.
        # (With `verify`, the same Redis call checks the grant's version: StaleGrant if it moved.)
        try:
            limits.check(caller=caller, workflow=workflow, tokens=context_tokens(payload), verify=verify)
        finally:
            verify = None
        endpoint = Endpoint.CHAT if chat else Endpoint.COMPLETION
        if parsed.stream:
            return _stream_response(
                workflow,
                payload,
                endpoint,
                caller,
                chat=chat,
                include_usage=parsed.include_usage,
                limits=limits,
            )
        result = route(
            workflow=workflow,
            request=payload,
            endpoint=endpoint,
            client_request_id=client_request_id,
            request_digest=request_digest(document) if key is not None else None,
            api_key_id=caller.token_id,
            # Only an opted-in workflow's requests are kept (inference.retention); the fold
            # checks the setting again, so an opt-out is not delayed by this cached row.
            retain=workflow.retain_prompts,
        )
    except _REFUSALS as exc:
        if verify is not None:
            # Refused before the rate-limit call checked the grant: check it now, so a changed
            # authorisation answers as it should (a revoked key: 401, not this refusal).
            version_check(verify)
        return _refusal(exc)
    limits.settle(_tokens_used(result))
    if not result.ok or result.completion is None:
        return _failure(result, caller, workflow.team_id)
    c = result.completion
    if c.raw is not None:
        # The provider's answer with every field it sent (tool calls, refusal, logprobs,
        # system_fingerprint, usage details, n choices); only the id and the model are ours.
        doc: dict[str, Any] = {
            **c.raw,
            "id": f"{'chatcmpl' if chat else 'cmpl'}-sy{result.request_id}",
            "model": workflow.slug,
        }
    else:
        doc = _synthesized(result, c, workflow.slug, chat=chat)
    response = HttpResponse(json.dumps(doc, separators=(",", ":")), content_type="application/json")
    _headers(response, result, result.deployment_slug, caller, workflow.team_id)
    return response


def _tokens_used(result: RouteResult | None) -> int | None:
    """What the provider reported (0 when nothing was answered), for the token limits."""
    if result is None:
        return None
    c = result.completion
    if c is None:
        return 0
    return c.tokens_in + c.tokens_out


def _sse(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


def _stream_response(
    workflow: Workflow,
    payload: InferenceInput,
    endpoint: str,
    caller: TokenGrant,
    *,
    chat: bool,
    include_usage: bool,
    limits: RateCheck,
) -> HttpResponse | StreamingHttpResponse:
    routed = route_stream(
        workflow=workflow,
        request=payload,
        endpoint=endpoint,
        api_key_id=caller.token_id,
        retain=workflow.retain_prompts,
    )
    if not routed.ok:
        assert routed.result is not None  # noqa: S101 (route_stream records a failure at once)
        limits.settle(0)
        return _failure(routed.result, caller, workflow.team_id)
    created = int(time.time())
    obj = "chat.completion.chunk" if chat else "text_completion"
    ident = f"chatcmpl-sy-{created}-{id(routed)}" if chat else f"cmpl-sy-{created}-{id(routed)}"

    def event(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "id": ident,
            "object": obj,
            "created": created,
            "model": workflow.slug,
            "choices": choices,
        }
        if usage is not None:
            doc["usage"] = usage
        return doc

    def passed_on(raw: dict[str, Any]) -> dict[str, Any] | None:
        """A provider's event as the client gets it: our id and model; the usage event (which
        the adapter always asks for, to bill) only when the client asked for it."""
        if not include_usage:
            if not raw.get("choices") and raw.get("usage"):
                return None
            raw = {k: v for k, v in raw.items() if k != "usage"}
        return {**raw, "id": ident, "model": workflow.slug}

    def docs() -> Iterator[dict[str, Any]]:
        """The events; a provider's own (`chunk.raw`) are passed on, others are made here."""
        started = False
        finish = "stop"
        tokens: tuple[int, int] | None = None
        made = False  # events made here (a provider that does not speak OpenAI's format)
        for chunk in routed:
            if chunk.raw is not None:
                doc = passed_on(chunk.raw)
                if doc is not None:
                    yield doc
                continue
            made = True
            if chat and not started:
                started = True
                yield event(
                    [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
                )
            if chunk.text:
                choice = (
                    {"index": 0, "delta": {"content": chunk.text}, "finish_reason": None}
                    if chat
                    else {"index": 0, "text": chunk.text, "finish_reason": None}
                )
                yield event([choice])
            if chunk.finish_reason:
                finish = chunk.finish_reason
            if chunk.tokens_in is not None:
                tokens = (chunk.tokens_in, chunk.tokens_out or 0)
        if not made:
            return
        last = (
            {"index": 0, "delta": {}, "finish_reason": finish}
            if chat
            else {"index": 0, "text": "", "finish_reason": finish}
        )
        yield event([last])
        if include_usage:
            t_in, t_out = tokens or (0, 0)
            yield event([], {"prompt_tokens": t_in, "completion_tokens": t_out, "total_tokens": t_in + t_out})

    def events() -> Iterator[bytes]:
        # The last event is held back until the stream has ended and been recorded, so that it
        # can carry the request's cost (`switchyard`: request_id, deployment, and cost and
        # currency for a caller whose role may see costs).
        held: dict[str, Any] | None = None
        for doc in docs():
            if held is not None:
                yield _sse(held)
            held = doc
        result = routed.result
        limits.settle(_tokens_used(result))
        if held is not None:
            if result is not None:
                held["switchyard"] = {"request_id": result.request_id, "deployment": result.deployment_slug}
                if caller.sees_costs(workflow.team_id):  # the rule of the x-switchyard-cost header
                    held["switchyard"] |= {"cost": f"{result.cost:f}", "currency": result.currency}
            yield _sse(held)
        yield b"data: [DONE]\n\n"

    response = StreamingHttpResponse(events(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    _headers(response, None, routed.deployment_slug, caller, workflow.team_id)
    return response


# --- Views ----------------------------------------------------------------------------------------------


@csrf_exempt
@transaction.non_atomic_requests
def chat_completions(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    return _complete(request, chat=True)


@csrf_exempt
@transaction.non_atomic_requests
def completions(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    return _complete(request, chat=False)


@csrf_exempt
@transaction.non_atomic_requests
def embeddings(request: HttpRequest) -> HttpResponse:
    """POST /v1/embeddings: routed like a completion, but only between deployments of one
    embedding model (inference.router), billed per input token. Idempotency-Key is not taken:
    a replay would have no vectors to give back."""
    if request.method != "POST":
        return _method_not_allowed("POST")
    limits = RateCheck()
    return limits.stamp(_embeddings_checked(request, limits))


def _embeddings_checked(request: HttpRequest, limits: RateCheck) -> HttpResponse:
    try:
        caller = _caller(request)
        parsed = embedding_request_parse(_body(request))
        assert parsed.model is not None  # noqa: S101 (required by the parser)
        workflow = _workflow(parsed.model, caller)
        _authorize(caller, workflow)
        # The inputs counted as every request's are (inference.admission); nothing is generated.
        limits.check(caller=caller, workflow=workflow, tokens=context_tokens(parsed.request))
        result = route(
            workflow=workflow, request=parsed.request, endpoint=Endpoint.EMBEDDING, api_key_id=caller.token_id
        )
    except _REFUSALS as exc:
        return _refusal(exc)
    limits.settle(_tokens_used(result))
    if not result.ok or result.completion is None or result.completion.raw is None:
        return _failure(result, caller, workflow.team_id)
    doc = {**result.completion.raw, "model": workflow.slug}
    response = HttpResponse(json.dumps(doc, separators=(",", ":")), content_type="application/json")
    _headers(response, result, result.deployment_slug, caller, workflow.team_id)
    return response


@csrf_exempt  # bearer tokens, never cookies: a POST is answered 405, not a CSRF page
@transaction.non_atomic_requests
def models(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":
        return _method_not_allowed("GET")
    try:
        caller = _caller(request)
    except GatewayError as exc:
        return error_response(exc.status, str(exc), exc.type, exc.code)
    # The workflows of the teams the key holds a role in (a team key's team only; every team
    # for a global role, which alone reaches workflows of no team), less those a limited key
    # does not list.
    teams = caller.visible_teams
    rows = Workflow.objects.select_related("team").order_by("slug")
    if teams is not None:
        rows = rows.filter(team_id__in=teams)
    if caller.workflow_ids is not None:
        rows = rows.filter(pk__in=caller.workflow_ids)
    data = [
        {
            "id": w.slug,
            "object": "model",
            "created": int(w.created_at.timestamp()),
            "owned_by": w.team_slug or "switchyard",
        }
        for w in rows
    ]
    return HttpResponse(json.dumps({"object": "list", "data": data}), content_type="application/json")
