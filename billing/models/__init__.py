"""Billing's models, one module per family: price books, the append-only ledger and its rollups
(ledger), budgets (budgets), alert channels and spend anomalies (alerts), exports (exports) and
invoice reconciliation (reconciliation). Every model is importable from billing.models."""

from __future__ import annotations

from billing.models.alerts import AlertChannel, AlertDelivery, AlertKind, SpendAnomaly
from billing.models.budgets import Budget, BudgetAlert, BudgetPeriod
from billing.models.exports import ExportJob
from billing.models.ledger import (
    LEDGER_PARTITION,
    AppendOnlyQuerySet,
    DailyRollup,
    LedgerHead,
    PriceBook,
    PriceSource,
    RollupWatermark,
    Unit,
    UsageRecord,
)
from billing.models.reconciliation import InvoiceImport, InvoiceLine

__all__ = [
    "LEDGER_PARTITION",
    "AlertChannel",
    "AlertDelivery",
    "AlertKind",
    "AppendOnlyQuerySet",
    "Budget",
    "BudgetAlert",
    "BudgetPeriod",
    "DailyRollup",
    "ExportJob",
    "InvoiceImport",
    "InvoiceLine",
    "LedgerHead",
    "PriceBook",
    "PriceSource",
    "RollupWatermark",
    "SpendAnomaly",
    "Unit",
    "UsageRecord",
]
