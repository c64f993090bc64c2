"""The gateway: OpenAI's /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models, and
as parse/respond pairs on the chat pipeline (inference.gateway.translated) OpenAI's
/v1/responses and Anthropic's /v1/messages and /v1/messages/count_tokens.

`model` names a workflow; the router picks the deployment. Plain Django views (no DRF) for
speed. Authentication is a Switchyard API token (`Authorization: Bearer sy_...`), optionally
scoped to workflows (ApiToken.workflows). Every answer carries the deployment that served it and
its cost in headers; errors are OpenAI-style bodies ({"error": {"message", "type", "param",
"code"}}), here and, for what happens outside these views under /v1 (size limit, unknown paths,
Django's error pages), in inference.gateway.middleware. Request bodies are checked in one place,
inference.gateway.openai_request, before the workflow is looked up or any provider called; what a
provider answered on failure is logged, never returned.

What a token may do comes from registry.auth.access, cached per process only while the
authorisation version in Redis stands (one GET per request), so a revoked token, a removed role
or a deactivated user is refused on the next request; without Redis, every request reads the
token from the database. With that and the workflow row cached, the database work per request in
the steady state is the ledger transaction alone.

Rate limits (inference.ratelimit.limits) are checked after the key, the body and the workflow, before
routing; their x-ratelimit-* headers go on every answer of a request they applied to.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from billing.budgets import BudgetExhausted
from billing.services import NoPriceError
from inference.adapters.base import InferenceInput
from inference.admission import input_tokens
from inference.cache import CacheAsk
from inference.gateway.apis import APIS, EMBEDDINGS, RESPONSES, Api, answer_document
from inference.gateway.caller import caller_authorize, caller_grant, caller_grant_deferred, caller_workflow
from inference.gateway.openai_body import InvalidRequest, json_document
from inference.gateway.openai_request import embedding_request_parse
from inference.gateway.responses import (
    GatewayError,
    answer_headers,
    error_response,
    invalid_response,
    method_not_allowed,
    route_failure,
    tokens_used,
)
from inference.gateway.stored import response_item_answer, responses_keep, responses_own, responses_turn
from inference.gateway.streaming import StreamTranslator, stream_response
from inference.gateway.translated.messages_request import API_VERSION, messages_request_parse
from inference.idempotency import IdempotencyConflict, caller_key_problem, request_digest, v1_request_id
from inference.models import Endpoint
from inference.ratelimit.limits import RateCheck, RateLimited, StaleGrant, version_check
from inference.router.calls import route_peek_ask
from inference.router.context import context_tokens
from inference.router.entry import route
from inference.router.errors import CapabilityMissing, CostLimitExceeded, NoRoute
from registry.models import Workflow

logger = logging.getLogger(__name__)


# --- Parsing -----------------------------------------------------------------------------------------


class _Body:
    """The request's JSON body (inference.gateway.openai_request checks shape, Unicode, depth),
    read from the stream once: a request started over with a fresh grant (StaleGrant) parses the
    same bytes again; a second read of the stream would find it empty.

    Read with its own limit, SWITCHYARD_V1_MAX_BODY_BYTES, not through `request.body`, whose
    DATA_UPLOAD_MAX_MEMORY_SIZE is the pages' and /api's. Read only when first asked for, after
    the key is checked."""

    def __init__(self, request: HttpRequest) -> None:
        self._request = request
        self._raw: bytes | None = None

    def document(self) -> dict[str, Any]:
        limit = settings.V1_MAX_BODY_BYTES
        if self._raw is None:
            self._raw = self._request.read(limit + 1)
        if len(self._raw) > limit:
            # Normally refused before the view by GatewayErrorsMiddleware (Content-Length); this
            # is the same answer for a body longer than it said.
            raise InvalidRequest(
                f"The request body is over the limit of {limit} bytes", code="request_too_large", status=413
            )
        return json_document(self._raw or b"null")


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
        return invalid_response(exc)
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


def _translator(
    spec: Api, model: str, body: dict[str, Any]
) -> Callable[[int | None], StreamTranslator] | None:
    """The stream translator of `spec`'s API for this request, given its id (None: chat's own)."""
    make = spec.stream
    if make is None:
        return None
    return lambda request_id: make(request_id, model, body)


def _complete(request: HttpRequest, *, api: str) -> HttpResponse | StreamingHttpResponse:
    """`api`: the key of inference.gateway.apis.APIS."""
    if request.method != "POST":
        return method_not_allowed("POST")
    body = _Body(request)
    try:
        limits = RateCheck()
        return limits.stamp(_complete_checked(request, body, api=api, limits=limits, fresh=False))
    except StaleGrant:
        # The cached grant was older than the authorisation version: once more, read afresh.
        limits = RateCheck()
        return limits.stamp(_complete_checked(request, body, api=api, limits=limits, fresh=True))


def _complete_checked(
    request: HttpRequest, body: _Body, *, api: str, limits: RateCheck, fresh: bool
) -> HttpResponse | StreamingHttpResponse:
    verify: bytes | None = None  # a cached grant not checked against the version yet
    spec = APIS[api]
    chat = spec.chat
    try:
        if fresh:
            caller = caller_grant(request)
        else:
            caller, verify = caller_grant_deferred(request)
        # The whole request is checked before the workflow is looked up or a provider called.
        document = body.document()
        own, previous = responses_own(document) if api == RESPONSES else (document, None)
        parsed = spec.parse(own)
        key = _idempotency_key(request)
        assert parsed.model is not None  # noqa: S101 (required by the parser)
        workflow = caller_workflow(parsed.model, caller)
        caller_authorize(caller, workflow)
        # A Responses request may continue a stored one (inference.gateway.stored).
        turn = responses_turn(own, previous, caller, workflow) if api == RESPONSES else None
        if turn is not None and turn.continued:
            parsed = spec.parse(turn.document)
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
            limits.check(
                caller=caller,
                workflow=workflow,
                tokens=context_tokens(payload),
                verify=verify,
                peek=lambda: route_peek_ask(workflow),
            )
        finally:
            verify = None
        endpoint = Endpoint.CHAT if chat else Endpoint.COMPLETION
        if parsed.stream:
            return stream_response(
                workflow,
                payload,
                endpoint,
                caller,
                chat=chat,
                include_usage=parsed.include_usage,
                limits=limits,
                translate=_translator(spec, workflow.slug, document),
            )
        result = route(
            workflow=workflow,
            request=payload,
            endpoint=endpoint,
            peeked=limits.peeked,
            client_request_id=client_request_id,
            request_digest=request_digest(document) if key is not None else None,
            api_key_id=caller.token_id,
            # Only an opted-in workflow's requests are kept (inference.retention); the fold
            # checks the setting again, so an opt-out is not delayed by this cached row.
            retain=workflow.retain_prompts,
            # A keyed request has its own replay (inference.idempotency); the rest may be
            # answered from the workflow's response cache, if it has one (inference.cache).
            cache=CacheAsk(api, turn.document if turn is not None else document) if key is None else None,
        )
    except _REFUSALS as exc:
        if verify is not None:
            # Refused before the rate-limit call checked the grant: check it now, so a changed
            # authorisation answers as it should (a revoked key: 401, not this refusal).
            version_check(verify)
        return _refusal(exc)
    limits.settle(tokens_used(result))
    if not result.ok or result.completion is None:
        return route_failure(result, caller, workflow.team_id)
    doc = answer_document(api, result, workflow.slug, document)
    if turn is not None:
        responses_keep(
            turn, request_id=result.request_id, workflow=workflow, answer=doc, replayed=result.replayed
        )
    response = HttpResponse(json.dumps(doc, separators=(",", ":")), content_type="application/json")
    answer_headers(response, result, result.deployment_slug, caller, workflow.team_id)
    return response


# --- Views ----------------------------------------------------------------------------------------------


@csrf_exempt
@transaction.non_atomic_requests
def chat_completions(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    return _complete(request, api="chat")


@csrf_exempt
@transaction.non_atomic_requests
def completions(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    return _complete(request, api="completion")


def _anthropic_version_problem(request: HttpRequest) -> HttpResponse | None:
    version = request.META.get("HTTP_ANTHROPIC_VERSION")
    if version is None or version == API_VERSION:
        return None
    return invalid_response(
        InvalidRequest(
            f"anthropic-version {version[:40]!r} is not supported: send {API_VERSION}",
            param="anthropic-version",
            code="invalid_anthropic_version",
        )
    )


@csrf_exempt
@transaction.non_atomic_requests
def responses(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """POST /v1/responses: OpenAI's Responses API on the chat pipeline."""
    return _complete(request, api="responses")


@csrf_exempt
@transaction.non_atomic_requests
def response_item(request: HttpRequest, response_id: str, rest: str = "") -> HttpResponse:
    """GET or DELETE /v1/responses/{id} (and .../input_items, .../cancel): a stored response
    (inference.gateway.stored)."""
    return response_item_answer(request, response_id, rest)


@csrf_exempt
@transaction.non_atomic_requests
def messages(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """POST /v1/messages: Anthropic's Messages API on the chat pipeline."""
    # Errors leave in Anthropic's shape: GatewayErrorsMiddleware rewrites every /v1/messages error.
    return _anthropic_version_problem(request) or _complete(request, api="messages")


@csrf_exempt
@transaction.non_atomic_requests
def messages_count_tokens(request: HttpRequest) -> HttpResponse:
    """POST /v1/messages/count_tokens: the request's input tokens as the router estimates them
    (inference.admission, the count limits and budgets use), not a provider's tokenizer.
    No provider is called and nothing is billed; the caller must be allowed the workflow."""
    if request.method != "POST":
        return method_not_allowed("POST")
    problem = _anthropic_version_problem(request)
    if problem is not None:
        return problem
    try:
        caller = caller_grant(request)
        parsed = messages_request_parse(_Body(request).document(), counting=True)
        assert parsed.model is not None  # noqa: S101 (required by the parser)
        workflow = caller_workflow(parsed.model, caller)
        caller_authorize(caller, workflow)
    except _REFUSALS as exc:
        return _refusal(exc)
    doc = {"input_tokens": input_tokens(parsed.request)}
    return HttpResponse(json.dumps(doc), content_type="application/json")


@csrf_exempt
@transaction.non_atomic_requests
def embeddings(request: HttpRequest) -> HttpResponse:
    """POST /v1/embeddings: routed like a completion, but only between deployments of one
    embedding model (inference.router), billed per input token. Idempotency-Key is not taken:
    a replay would have no vectors to give back."""
    if request.method != "POST":
        return method_not_allowed("POST")
    limits = RateCheck()
    return limits.stamp(_embeddings_checked(request, limits))


def _embeddings_checked(request: HttpRequest, limits: RateCheck) -> HttpResponse:
    try:
        caller = caller_grant(request)
        parsed = embedding_request_parse(_Body(request).document())
        assert parsed.model is not None  # noqa: S101 (required by the parser)
        workflow = caller_workflow(parsed.model, caller)
        caller_authorize(caller, workflow)
        # The inputs counted as every request's are (inference.admission); nothing is generated.
        limits.check(
            caller=caller,
            workflow=workflow,
            tokens=context_tokens(parsed.request),
            peek=lambda: route_peek_ask(workflow),
        )
        result = route(
            workflow=workflow,
            request=parsed.request,
            endpoint=Endpoint.EMBEDDING,
            api_key_id=caller.token_id,
            peeked=limits.peeked,
        )
    except _REFUSALS as exc:
        return _refusal(exc)
    limits.settle(tokens_used(result))
    if not result.ok or result.completion is None or result.completion.raw is None:
        return route_failure(result, caller, workflow.team_id)
    doc = answer_document(EMBEDDINGS, result, workflow.slug, {})
    response = HttpResponse(json.dumps(doc, separators=(",", ":")), content_type="application/json")
    answer_headers(response, result, result.deployment_slug, caller, workflow.team_id)
    return response


@csrf_exempt  # bearer tokens, never cookies: a POST is answered 405, not a CSRF page
@transaction.non_atomic_requests
def models(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":
        return method_not_allowed("GET")
    try:
        caller = caller_grant(request)
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
