"""The /v1 data plane's WSGI handler: the gateway's requests skip the pages' middleware chain.

A `/v1` call is a bearer-token JSON request: it uses no session, CSRF token, messages, login
throttling, audit origin, static files or clickjacking header, and paying for that chain on
every call was a large part of the gateway's overhead (issue 28). stack.wsgi sends a path under
/v1 here and everything else to Django's own handler with the full settings.MIDDLEWARE.

Here each request runs through V1_MIDDLEWARE only:

* SecurityMiddleware: the same security headers (nosniff, referrer policy, HSTS and the HTTPS
  redirect in production) as every other answer;
* GatewayErrorsMiddleware: the body limit from Content-Length, OpenAI-shaped errors for whatever
  went wrong (unknown path, a view's exception, a bad Host), as under the full chain;
* DataPlaneEntry: checks the Host against ALLOWED_HOSTS (CommonMiddleware's job on the full
  chain) and resolves against the gateway's routes alone (stack.dataplane.urls).

Settings, the ORM and its connections are Django's as ever: the handler is Django's WSGIHandler
(request_started / request_finished close stale database connections) with a shorter chain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.handlers.exception import convert_exception_to_response
from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest, HttpResponseBase
from django.utils.module_loading import import_string

V1_URLCONF = "stack.dataplane.urls"
V1_MIDDLEWARE = (
    "django.middleware.security.SecurityMiddleware",
    "inference.gateway.middleware.GatewayErrorsMiddleware",
    "stack.dataplane.DataPlaneEntry",
)


class DataPlaneEntry:
    """The last middleware before the view: the Host checked, the gateway's routes only."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        # DisallowedHost (a SuspiciousOperation) answers 400 in the OpenAI shape
        # (GatewayErrorsMiddleware.process_exception), as it does under the full chain.
        request.get_host()
        request.urlconf = V1_URLCONF  # type: ignore[attr-defined]
        return self.get_response(request)


class DataPlaneHandler(WSGIHandler):
    """Django's WSGI handler with V1_MIDDLEWARE instead of settings.MIDDLEWARE (synchronous
    middleware only, which is all V1_MIDDLEWARE holds)."""

    def load_middleware(self, is_async: bool = False) -> None:
        if is_async:
            raise ImproperlyConfigured("the /v1 data plane is served over WSGI only")
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        handler = convert_exception_to_response(self._get_response)  # type: ignore[attr-defined]
        for path in reversed(V1_MIDDLEWARE):
            instance = import_string(path)(handler)
            if hasattr(instance, "process_view"):
                self._view_middleware.insert(0, instance.process_view)
            if hasattr(instance, "process_exception"):
                self._exception_middleware.append(instance.process_exception)
            handler = convert_exception_to_response(instance)
        self._middleware_chain = handler


def is_data_plane(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")
