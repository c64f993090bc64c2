"""Carries each request into the audit origin: one ContextVar set and reset, no query.

The surface comes from the path (/api/, /v1/, /admin/, else a page); the user is read only if a
tracked object is written during the request, so /v1 calls pay for nothing else.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase

from registry.audit import origin as context


class AuditOriginMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        token = context.enter_request(request)
        try:
            return self.get_response(request)
        finally:
            context.leave_request(token)
