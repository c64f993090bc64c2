"""Billing's API on the project's /api/ router: the ledger, price books, budgets, exports, reconciliation.

One module per resource; `register` mounts the viewsets, and stack.urls mounts
UsageExportView (a plain APIView) at /api/usage-export/ itself.
"""

from __future__ import annotations

from rest_framework.routers import BaseRouter

from billing.api.budgets import BudgetAlertViewSet, BudgetViewSet
from billing.api.exports import ExportJobViewSet, UsageExportView
from billing.api.ledger import UsageRecordViewSet
from billing.api.prices import PriceBookViewSet
from billing.api.reconciliation import InvoiceImportViewSet

__all__ = [
    "BudgetAlertViewSet",
    "BudgetViewSet",
    "ExportJobViewSet",
    "InvoiceImportViewSet",
    "PriceBookViewSet",
    "UsageExportView",
    "UsageRecordViewSet",
    "register",
]


def register(router: BaseRouter) -> None:
    """Mount billing's viewsets on the project's /api/ router."""
    router.register("usage-records", UsageRecordViewSet, basename="usagerecord")
    router.register("price-books", PriceBookViewSet)
    router.register("budgets", BudgetViewSet)
    router.register("budget-alerts", BudgetAlertViewSet, basename="budgetalert")
    router.register("export-jobs", ExportJobViewSet, basename="exportjob")
    router.register("invoice-imports", InvoiceImportViewSet, basename="invoiceimport")
