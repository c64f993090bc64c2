"""OpenAI-style JSON errors on every /v1 answer, whoever produced the error.

The gateway's views answer their own errors in the OpenAI shape; this middleware covers the rest
under the /v1 prefix, in one place: a body over SWITCHYARD_V1_MAX_BODY_BYTES (413, refused from
its Content-Length before anything reads it; the pages' and /api's DATA_UPLOAD_MAX_MEMORY_SIZE is
not /v1's, whose long contexts and images need more), an unknown path (Django's 404), an exception in a
view (500, logged here), and any other error page Django or a middleware renders (400 for a bad
Host, 403...), which is rewritten into the same shape with its status kept. Other paths are
left alone.

A database that is down or restarting (an OperationalError or InterfaceError out of the view:
refused or timed-out connects, connections the server dropped) is a 503 `database_unavailable`
with Retry-After, not a 500: an answer that could not be recorded is not handed out, and the
client may retry. Django closes the broken connection at the end of the request and checks a
kept one before the next request uses it (CONN_HEALTH_CHECKS), so answers resume by themselves
once the database is back (tests/integration/test_restart_drills.py).

Under /v1/messages (Anthropic's Messages API) every error, the views' own included, leaves here in
Anthropic's shape instead (`{"type": "error", "error": {...}}`, its status and headers kept).

Installed in settings.MIDDLEWARE right after SecurityMiddleware, so it sees the answers of every
middleware below it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import BadRequest, PermissionDenied, RequestDataTooBig, SuspiciousOperation
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase

from inference.gateway.responses import error_response
from inference.gateway.translated.messages_answer import error_body

ANTHROPIC_PREFIX = "/v1/messages"

PREFIX = "/v1"
logger = logging.getLogger(__name__)

# status -> (type, code) for errors the gateway's views did not shape themselves.
_KINDS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "bad_request"),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", "forbidden"),
    404: ("invalid_request_error", "unknown_url"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
}


def is_gateway_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def _generic(status: int, request: HttpRequest) -> HttpResponse:
    type_, code = _KINDS.get(
        status, ("api_error", "internal_error") if status >= 500 else ("invalid_request_error", "error")
    )
    if status == 404:
        # OpenAI's own wording for an unknown route.
        message = f"Invalid URL ({request.method} {request.path[:200]})"
    elif status == 405:
        message = f"Method {request.method} is not allowed on {request.path[:200]}"
    elif status >= 500:
        message = "The server had an error while processing the request"
    else:
        message = f"The request was refused (HTTP {status})"
    return error_response(status, message, type_, code)


# Seconds a client is asked to wait before retrying a request the database could not take.
DATABASE_RETRY_AFTER_S = 1
_DATABASE_WARN_EVERY_S = 10.0
_database_warned_at = 0.0


def _database_unavailable(request: HttpRequest, exception: Exception) -> HttpResponse:
    """503 for a request the database could not take; logged once per 10 s, not once per
    request (an outage under traffic would flood the log)."""
    global _database_warned_at
    now = time.monotonic()
    if now - _database_warned_at > _DATABASE_WARN_EVERY_S:
        _database_warned_at = now
        logger.warning(
            "database unavailable: answering 503 on %s (%s: %s)",
            request.path,
            type(exception).__name__,
            str(exception).strip()[:300],
        )
    response = error_response(
        503,
        "The database is unavailable; retry shortly",
        "api_error",
        "database_unavailable",
    )
    response["Retry-After"] = str(DATABASE_RETRY_AFTER_S)
    return response


def _too_big(request: HttpRequest) -> HttpResponse | None:
    """413 (or 400 for a Content-Length that is no length) before anything reads the body."""
    raw = request.META.get("CONTENT_LENGTH") or "0"
    try:
        length = int(raw)
    except ValueError:
        length = -1
    if length < 0:
        return error_response(400, "Content-Length is not a length", "invalid_request_error", "bad_request")
    files = request.path_info.rstrip("/") == "/v1/files"  # an upload, under its own limit
    limit = settings.V1_MAX_FILE_BYTES if files else settings.V1_MAX_BODY_BYTES
    if length > limit:
        return error_response(
            413,
            f"The request body is {length} bytes; the limit is {limit} bytes",
            "invalid_request_error",
            "request_too_large",
        )
    return None


def _anthropic_shaped(response: HttpResponse) -> HttpResponse:
    """An OpenAI-shaped error answer rewritten in Anthropic's error shape (status and headers kept)."""
    if response.status_code < 400 or not response.get("Content-Type", "").startswith("application/json"):
        return response
    try:
        doc = json.loads(response.content)
    except ValueError:
        return response
    if not isinstance(doc, dict) or not isinstance(doc.get("error"), dict) or "type" in doc:
        return response
    response.content = json.dumps(error_body(response.status_code, doc)).encode()
    if response.has_header("Content-Length"):
        response["Content-Length"] = str(len(response.content))
    return response


class GatewayErrorsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if not is_gateway_path(request.path_info):
            return self.get_response(request)
        response = self._answer(request)
        path = request.path_info
        if (path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")) and isinstance(
            response, HttpResponse
        ):
            return _anthropic_shaped(response)
        return response

    def _answer(self, request: HttpRequest) -> HttpResponseBase:
        refused = _too_big(request)
        if refused is not None:
            # No `Connection: close` here although the body was not read: a WSGI application may
            # not set hop-by-hop headers (wsgiref and runserver answer a plain 500 instead). The
            # servers deal with the unread body themselves: runserver drains it, gunicorn drains
            # or closes the connection before the next request, wsgiref speaks HTTP/1.0 and closes.
            # Content-Length lets a client read the answer while the server still drains.
            refused["Content-Length"] = str(len(refused.content))
            return refused
        response = self.get_response(request)
        if response.status_code >= 400 and not response.get("Content-Type", "").startswith(
            "application/json"
        ):
            shaped = _generic(response.status_code, request)
            if response.has_header("Allow"):
                shaped["Allow"] = response["Allow"]
            return shaped
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not is_gateway_path(request.path_info):
            return None
        if isinstance(exception, RequestDataTooBig):
            return _generic(413, request)
        if isinstance(exception, Http404):
            return _generic(404, request)
        if isinstance(exception, PermissionDenied):
            return _generic(403, request)
        if isinstance(exception, BadRequest | SuspiciousOperation):
            return _generic(400, request)
        if isinstance(exception, OperationalError | InterfaceError):
            return _database_unavailable(request, exception)
        logger.error("unhandled error on %s %s", request.method, request.path, exc_info=exception)
        return _generic(500, request)
