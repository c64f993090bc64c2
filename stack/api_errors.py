"""API error mapping: domain errors become their status code with field messages."""

from __future__ import annotations

from typing import Any

from django.db.models import ProtectedError
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from registry.errors import DomainError


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError | ProtectedError):
        # ATOMIC_REQUESTS: a handled error must still roll back what the
        # request wrote before it (DRF does this for its own exceptions).
        set_rollback()
    if isinstance(exc, DomainError):
        return Response(exc.api_body(), status=exc.status_code)
    if isinstance(exc, ProtectedError):
        return Response(
            {"detail": "still referenced by other records (usage, jobs or routes); disable it instead"},
            status=status.HTTP_409_CONFLICT,
        )
    return drf_exception_handler(exc, context)
