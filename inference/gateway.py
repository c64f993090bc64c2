"""The OpenAI-compatible gateway: /v1/chat/completions, /v1/completions, /v1/models.

`model` names a workflow; the router picks the deployment. Plain Django views (no DRF) for
speed. Authentication is a Switchyard API token (`Authorization: Bearer sy_...`), optionally
scoped to workflows (ApiToken.workflows). Every answer carries the deployment that served it and
its cost in headers; errors are OpenAI-style bodies ({"error": {"message", "type", "code"}}).

Authenticated tokens and workflow look-ups are cached per process for AUTH_CACHE_SECONDS (a
revoked token stops working within that time), so a request costs no registry queries in the
steady state: the database work per request is the ledger transaction alone.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from billing.budgets import BudgetExhausted
from billing.services import NoPriceError
from inference.adapters.base import ChatMessage, ChatRequest, CompletionRequest, InferenceInput
from inference.models import Endpoint
from inference.router import NoRoute, RouteResult, route, route_stream
from stack.registry.models import Workflow
from stack.registry.roles import ALL_ROLES, user_has_role
from stack.registry.services import api_token_authenticate

AUTH_CACHE_SECONDS = 5.0


class GatewayError(Exception):
    def __init__(self, status: int, message: str, *, type_: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.code = code


def _error(status: int, message: str, type_: str, code: str | None = None) -> HttpResponse:
    body = json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})
    response = HttpResponse(body, status=status, content_type="application/json")
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="switchyard"'
    return response


# --- Authentication and scope (cached) ---------------------------------------------------------------


@dataclass(frozen=True)
class _Caller:
    token_id: int
    may_read: bool
    scope: frozenset[int] | None  # None: every workflow
    expires: float


_callers: dict[str, _Caller] = {}
_workflows: dict[str, tuple[Workflow, float]] = {}
_cache_lock = threading.Lock()


def gateway_caches_clear() -> None:
    with _cache_lock:
        _callers.clear()
        _workflows.clear()


def _caller(request: HttpRequest) -> _Caller:
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
    now = time.monotonic()
    hit = _callers.get(raw)
    if hit is not None and hit.expires > now:
        return hit
    token = api_token_authenticate(raw=raw)
    if token is None or not token.user.is_active:
        raise GatewayError(
            401, "Invalid or revoked API key", type_="invalid_request_error", code="invalid_api_key"
        )
    scope = frozenset(token.workflows.values_list("id", flat=True)) or None
    caller = _Caller(
        token_id=token.pk,
        may_read=user_has_role(token.user, ALL_ROLES),
        scope=scope,
        expires=now + AUTH_CACHE_SECONDS,
    )
    with _cache_lock:
        if len(_callers) > 10_000:
            _callers.clear()
        _callers[raw] = caller
    return caller


def _workflow(slug: str) -> Workflow:
    now = time.monotonic()
    hit = _workflows.get(slug)
    if hit is not None and hit[1] > now:
        return hit[0]
    workflow = Workflow.objects.filter(slug=slug).first()
    if workflow is None:
        raise GatewayError(
            404,
            f"The model (workflow) {slug!r} does not exist",
            type_="invalid_request_error",
            code="model_not_found",
        )
    with _cache_lock:
        _workflows[slug] = (workflow, now + AUTH_CACHE_SECONDS)
    return workflow


def _authorize(caller: _Caller, workflow: Workflow) -> None:
    if not caller.may_read or (caller.scope is not None and workflow.pk not in caller.scope):
        raise GatewayError(
            403,
            f"This API key may not call workflow {workflow.slug!r}",
            type_="permission_error",
            code="workflow_not_allowed",
        )


# --- Parsing -----------------------------------------------------------------------------------------


def _body(request: HttpRequest) -> dict[str, Any]:
    try:
        body = json.loads(request.body or b"null")
    except ValueError:
        raise GatewayError(400, "The request body is not valid JSON", type_="invalid_request_error") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "The request body must be a JSON object", type_="invalid_request_error")
    return body


def _invalid(message: str, param: str) -> GatewayError:
    return GatewayError(400, message, type_="invalid_request_error", code=f"invalid_{param}")


def _common(body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise _invalid("max_tokens must be a positive integer", "max_tokens")
        out["max_tokens"] = max_tokens
    for name, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        value = body.get(name)
        if value is not None:
            if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high:
                raise _invalid(f"{name} must be a number between {low:g} and {high:g}", name)
            out[name] = float(value)
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 4:
            raise _invalid("stop must be a string or a list of at most 4 strings", "stop")
        out["stop"] = tuple(stop)
    n = body.get("n", 1)
    if n != 1:
        raise _invalid("only n=1 is supported", "n")
    return out


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid("model is required: the slug of a Switchyard workflow", "model")
    return model


def _content(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for part in value:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise _invalid("message content parts must be {'type': 'text', 'text': ...}", "messages")
            parts.append(part["text"])
        return "".join(parts)
    if value is None:
        return ""
    raise _invalid("message content must be a string or a list of text parts", "messages")


def _chat_request(body: dict[str, Any]) -> ChatRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages must be a non-empty list", "messages")
    parsed = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _invalid("each message needs a role and content", "messages")
        parsed.append(ChatMessage(role=m["role"], content=_content(m.get("content"))))
    return ChatRequest(messages=tuple(parsed), **_common(body))


def _completion_request(body: dict[str, Any]) -> CompletionRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _invalid("prompt must be a string", "prompt")
    return CompletionRequest(prompt=prompt, **_common(body))


def _stream_flag(body: dict[str, Any]) -> bool:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _invalid("stream must be true or false", "stream")
    return stream


# --- Responses -----------------------------------------------------------------------------------------


def _headers(response: HttpResponse | StreamingHttpResponse, result: RouteResult | None, slug: str) -> None:
    response["x-switchyard-deployment"] = slug
    if result is not None:
        response["x-switchyard-cost"] = f"{result.cost:f}"
        response["x-switchyard-currency"] = result.currency
        if result.request_id is not None:
            response["x-switchyard-request-id"] = str(result.request_id)
        if result.policy_version is not None:
            response["x-switchyard-policy-version"] = str(result.policy_version)


def _failure(result: RouteResult) -> HttpResponse:
    if result.status_code == 429:
        response = _error(
            429, f"Every deployment is rate limited: {result.error}", "rate_limit_error", "rate_limited"
        )
    elif result.status_code in (400, 413, 422):
        response = _error(
            400,
            f"The provider refused the request: {result.error}",
            "invalid_request_error",
            "provider_rejected",
        )
    else:
        response = _error(502, f"No deployment could answer: {result.error}", "api_error", "upstream_error")
    _headers(response, result, "")
    return response


def _complete(request: HttpRequest, *, chat: bool) -> HttpResponse | StreamingHttpResponse:
    if request.method != "POST":
        return _error(405, "Use POST", "invalid_request_error", "method_not_allowed")
    try:
        caller = _caller(request)
        body = _body(request)
        workflow = _workflow(_model(body))
        _authorize(caller, workflow)
        payload: InferenceInput = _chat_request(body) if chat else _completion_request(body)
        stream = _stream_flag(body)
        endpoint = Endpoint.CHAT if chat else Endpoint.COMPLETION
        if stream:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return _stream_response(workflow, payload, endpoint, chat=chat, include_usage=include_usage)
        idempotency_key = request.META.get("HTTP_IDEMPOTENCY_KEY") or None
        result = route(
            workflow=workflow, request=payload, endpoint=endpoint, client_request_id=idempotency_key
        )
    except GatewayError as exc:
        return _error(exc.status, str(exc), exc.type, exc.code)
    except BudgetExhausted as exc:
        return _error(402, f"Budget exhausted: {exc}", "insufficient_quota", "budget_exhausted")
    except NoRoute as exc:
        return _error(503, str(exc), "api_error", "no_route")
    except NoPriceError as exc:
        # A price ended between routing and recording: nothing was recorded (the ledger refuses
        # unpriced usage), so the answer is not handed out unbilled either.
        return _error(502, f"Pricing changed while answering; retry: {exc}", "api_error", "no_price")
    if not result.ok or result.completion is None:
        return _failure(result)
    c = result.completion
    created = int(time.time())
    usage = {
        "prompt_tokens": c.tokens_in,
        "completion_tokens": c.tokens_out,
        "total_tokens": c.tokens_in + c.tokens_out,
    }
    if chat:
        doc: dict[str, Any] = {
            "id": f"chatcmpl-sy{result.request_id}",
            "object": "chat.completion",
            "created": created,
            "model": workflow.slug,
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
    else:
        doc = {
            "id": f"cmpl-sy{result.request_id}",
            "object": "text_completion",
            "created": created,
            "model": workflow.slug,
            "choices": [{"index": 0, "text": c.text, "finish_reason": c.finish_reason, "logprobs": None}],
            "usage": usage,
        }
    response = HttpResponse(json.dumps(doc, separators=(",", ":")), content_type="application/json")
    _headers(response, result, result.deployment_slug)
    return response


def _stream_response(
    workflow: Workflow, payload: InferenceInput, endpoint: str, *, chat: bool, include_usage: bool
) -> HttpResponse | StreamingHttpResponse:
    routed = route_stream(workflow=workflow, request=payload, endpoint=endpoint)
    if not routed.ok:
        assert routed.result is not None  # noqa: S101 (route_stream records a failure at once)
        return _failure(routed.result)
    created = int(time.time())
    obj = "chat.completion.chunk" if chat else "text_completion"
    ident = f"chatcmpl-sy-{created}-{id(routed)}" if chat else f"cmpl-sy-{created}-{id(routed)}"

    def event(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
        doc: dict[str, Any] = {
            "id": ident,
            "object": obj,
            "created": created,
            "model": workflow.slug,
            "choices": choices,
        }
        if usage is not None:
            doc["usage"] = usage
        return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

    def events() -> Iterator[bytes]:
        if chat:
            yield event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        finish = "stop"
        tokens: tuple[int, int] | None = None
        for chunk in routed:
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
        last = (
            {"index": 0, "delta": {}, "finish_reason": finish}
            if chat
            else {"index": 0, "text": "", "finish_reason": finish}
        )
        yield event([last])
        if include_usage:
            result = routed.result
            t_in, t_out = tokens or (
                (result.completion.tokens_in, result.completion.tokens_out)
                if result and result.completion
                else (0, 0)
            )
            yield event([], {"prompt_tokens": t_in, "completion_tokens": t_out, "total_tokens": t_in + t_out})
        yield b"data: [DONE]\n\n"

    response = StreamingHttpResponse(events(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    _headers(response, None, routed.deployment_slug)
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


@transaction.non_atomic_requests
def models(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":
        return _error(405, "Use GET", "invalid_request_error", "method_not_allowed")
    try:
        caller = _caller(request)
    except GatewayError as exc:
        return _error(exc.status, str(exc), exc.type, exc.code)
    rows = Workflow.objects.order_by("slug") if caller.may_read else Workflow.objects.none()
    if caller.scope is not None:
        rows = rows.filter(pk__in=caller.scope)
    data = [
        {
            "id": w.slug,
            "object": "model",
            "created": int(w.created_at.timestamp()),
            "owned_by": w.team or "switchyard",
        }
        for w in rows
    ]
    return HttpResponse(json.dumps({"object": "list", "data": data}), content_type="application/json")
