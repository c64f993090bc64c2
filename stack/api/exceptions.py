"""API error mapping: domain errors become 400/409 with field messages."""

from __future__ import annotations

from typing import Any

from django.db.models import ProtectedError
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from billing.budgets import BudgetExhausted
from billing.services import NoPriceError
from stack.services import RegistryError
from training.services import DispatchError


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, RegistryError | DispatchError | NoPriceError | ProtectedError | BudgetExhausted):
        # ATOMIC_REQUESTS: a handled error must still roll back what the
        # request wrote before it (DRF does this for its own exceptions).
        set_rollback()
    if isinstance(exc, RegistryError | DispatchError):
        field = exc.field or "non_field_errors"
        return Response({field: [str(exc)]}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, NoPriceError):
        return Response({"non_field_errors": [str(exc)]}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, BudgetExhausted):
        # Fail closed, naming the budget: the caller may not spend until it is raised.
        return Response(
            {"detail": str(exc), "code": "budget_exhausted"}, status=status.HTTP_402_PAYMENT_REQUIRED
        )
    if isinstance(exc, ProtectedError):
        return Response(
            {"detail": "still referenced by other records (usage, jobs or routes); disable it instead"},
            status=status.HTTP_409_CONFLICT,
        )
    return drf_exception_handler(exc, context)
