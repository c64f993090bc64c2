"""Refuse request text that cannot be stored before any view sees it: a path, a query string or
form fields of a POST (and uploaded files' names) holding NUL, another control character or an
unpaired surrogate answer 400 naming the parameter.

PostgreSQL refuses NUL in text, so "?workflow=a%00" or a slug "a%00" in a path reached the
database as a DataError (a server error) wherever a view looked it up. The API's other bodies
(JSON; forms sent with PUT or PATCH) are checked by its parsers (registry.api.parsers); /v1/ (the
OpenAI-compatible gateway) answers its own errors in OpenAI's shape and is left to it.

ApiNotFoundMiddleware: a path under /api/ that no route matches (an id that is not a number, a
slug with a dot, a misspelt collection) answers 404 in JSON like every other API error, not
Django's HTML page (DRF answers the 404s of the paths it routes itself).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.datastructures import MultiValueDict
from django.utils.html import escape

from registry.validation import text_problem

API_PREFIX = "/api/"
EXEMPT_PREFIXES = ("/v1/",)
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def form_text_problems(
    data: MultiValueDict[str, Any], files: MultiValueDict[str, Any] | None = None
) -> dict[str, list[str]]:
    """Per field name, why its name or a value (or an uploaded file's name) cannot be stored."""
    problems: dict[str, list[str]] = {}
    for source, names in ((data, False), (files, True)):
        for name, values in (source or MultiValueDict()).lists():
            texts = [name, *((f.name or "") for f in values)] if names else [name, *values]
            for text in texts:
                problem = text_problem(text) if isinstance(text, str) else None
                if problem is not None:
                    problems.setdefault(name, []).append(problem)
                    break
    return problems


def _problems(request: HttpRequest) -> dict[str, list[str]]:
    problems: dict[str, list[str]] = {}
    path_problem = text_problem(request.path)
    if path_problem is not None:
        problems["path"] = [path_problem]
    problems.update(form_text_problems(request.GET))
    if request.method == "POST" and request.content_type in FORM_TYPES:
        # Pages' forms, and the API's form posts (whose other bodies its parsers check).
        problems.update(form_text_problems(request.POST, request.FILES))
    return problems


class InputTextMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(EXEMPT_PREFIXES):
            problems = _problems(request)
            if problems:
                return _refusal(request, problems)
        return self.get_response(request)


class ApiNotFoundMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        # resolver_match is set once a route matched: the 404s of matched routes are the views' own.
        if (
            response.status_code == 404
            and request.path.startswith(API_PREFIX)
            and getattr(request, "resolver_match", None) is None
        ):
            return JsonResponse({"detail": "Not found."}, status=404)
        return response


def _refusal(request: HttpRequest, problems: dict[str, list[str]]) -> HttpResponse:
    if request.path.startswith(API_PREFIX):
        return JsonResponse(problems, status=400)
    items = "".join(
        f"<li>{escape(name)}: {escape(' '.join(messages))}</li>" for name, messages in problems.items()
    )
    return HttpResponse(
        f"<!doctype html><title>Bad request</title><h1>Bad request</h1><ul>{items}</ul>"
        "<p>Remove the control characters and try again.</p>",
        status=400,
    )
