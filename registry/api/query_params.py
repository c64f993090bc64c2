"""The API refuses query parameters an endpoint does not know, with 400 naming each.

A misspelt filter (`?provder=aws` on the ledger) used to be dropped silently and the whole list
answered, as a misspelt export filter exported everything. Every generic view runs this backend
(REST_FRAMEWORK's DEFAULT_FILTER_BACKENDS); a view names the parameters it reads in
`query_params_known`, and the pagination's and DRF's `format` are always known.

A filter whose values are a fixed set (documented as an enum in the schema) reads its value with
`query_choice`, which refuses any other value with 400 naming the parameter and the choices,
instead of answering an empty list as if the value could match.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import QuerySet
from rest_framework.exceptions import ValidationError
from rest_framework.filters import BaseFilterBackend
from rest_framework.request import Request

ALWAYS_KNOWN = frozenset({"format"})  # DRF's renderer override (?format=json)


def known_query_params(view: Any) -> frozenset[str]:
    known = set(ALWAYS_KNOWN) | set(getattr(view, "query_params_known", ()))
    paginator = getattr(view, "paginator", None)
    for name in ("limit_query_param", "offset_query_param", "page_query_param", "page_size_query_param"):
        value = getattr(paginator, name, None)
        if value:
            known.add(value)
    return frozenset(known)


class KnownQueryParams(BaseFilterBackend):
    def filter_queryset(self, request: Request, queryset: QuerySet[Any], view: Any) -> QuerySet[Any]:
        known = known_query_params(view)
        unknown = sorted(name for name in request.query_params if name not in known)
        if unknown:
            expected = ", ".join(sorted(known - ALWAYS_KNOWN)) or "none"
            raise ValidationError(
                {name: [f"unknown query parameter; this endpoint takes: {expected}"] for name in unknown}
            )
        return queryset


def query_choice(request: Request, name: str, choices: Iterable[str]) -> str | None:
    """The value of query parameter `name`, one of `choices`; None when it is absent or empty."""
    value = request.query_params.get(name, "")
    if value == "":
        return None
    allowed = list(choices)
    if value not in allowed:
        raise ValidationError({name: [f"must be one of: {', '.join(allowed)}"]})
    return value
