"""The gateway's answers: OpenAI-style errors (every /v1 error goes through `error_response`),
the headers every routed answer carries, and the answer of a route on which every deployment failed."""

from __future__ import annotations

import json
import logging
import math

from django.http import HttpResponse, StreamingHttpResponse

from inference.adapters.base import CLIENT_ERROR_STATUSES
from inference.gateway.openai_body import InvalidRequest, error_document
from inference.router.errors import RouteResult
from registry.auth.access import TokenGrant

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


def method_not_allowed(allowed: str) -> HttpResponse:
    response = error_response(405, f"Use {allowed}", "invalid_request_error", "method_not_allowed")
    response["Allow"] = allowed
    return response


def invalid_response(exc: InvalidRequest) -> HttpResponse:
    return error_response(exc.status, str(exc), "invalid_request_error", exc.code, param=exc.param)


def answer_headers(
    response: HttpResponse | StreamingHttpResponse,
    result: RouteResult | None,
    slug: str,
    caller: TokenGrant,
    team_id: int | None,
) -> None:
    response["x-switchyard-deployment"] = slug
    if result is not None:
        if caller.sees_costs(team_id):  # money per team: registry.auth.principal
            response["x-switchyard-cost"] = f"{result.cost:f}"
            response["x-switchyard-currency"] = result.currency
            if result.cost_avoided is not None:
                response["x-switchyard-cost-avoided"] = f"{result.cost_avoided:f}"
        if result.cost_avoided is not None:
            response["x-switchyard-cache"] = "hit"  # answered from the response cache (inference.cache)
            if result.cache_similarity is not None:  # for another prompt this similar
                response["x-switchyard-cache-similarity"] = f"{result.cache_similarity:.4f}"
        if result.request_id is not None:
            response["x-switchyard-request-id"] = str(result.request_id)
        if result.policy_version is not None:
            response["x-switchyard-policy-version"] = str(result.policy_version)


def route_failure(result: RouteResult, caller: TokenGrant, team_id: int | None) -> HttpResponse:
    """Every deployment failed. The caller gets the status class, an OpenAI-style type and the
    request id; what the providers said stays in the logs and the request's attempts (an
    upstream body may name internal hosts or echo another system's data). An adapter's own
    refusal (a field its provider's format cannot carry) is ours, and is shown."""
    logger.warning(
        "v1 request %s failed (last status %s): %s", result.request_id, result.status_code, result.error
    )
    ref = f" (request {result.request_id})" if result.request_id is not None else ""
    if result.status_code in CLIENT_ERROR_STATUSES:
        response = error_response(
            400,
            f"The request cannot be sent to its provider: {result.refusal}{ref}"
            if result.refusal
            else f"The provider refused the request as invalid{ref}",
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
    answer_headers(response, result, "", caller, team_id)
    return response


def tokens_used(result: RouteResult | None) -> int | None:
    """What the provider reported (0 when nothing was answered, or when the response cache
    answered: a hit calls no provider), for the token limits."""
    if result is None:
        return None
    c = result.completion
    if c is None or result.cost_avoided is not None:
        return 0
    return c.tokens_in + c.tokens_out
