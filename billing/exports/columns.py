"""The export's shape: formats and file names, the FOCUS and x_ columns, and how times read as text."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

FORMATS = ("csv", "jsonl", "parquet")
FILE_NAMES = {"csv": "usage.csv", "jsonl": "usage.jsonl", "parquet": "usage.parquet"}
CONTENT_TYPES = {
    "csv": "text/csv; charset=utf-8",
    "jsonl": "application/x-ndjson",
    "parquet": "application/vnd.apache.parquet",
    "json": "application/json",
}
MANIFEST_NAME = "manifest.json"

# FOCUS 1.2's CostAndUsage columns: every mandatory one, and the conditional ones that apply to a
# ledger of metered usage priced from published price books (usage measurement, unit pricing,
# resources with types, regions, tags). billing.focus says how each value is chosen.
FOCUS_COLUMNS = (
    "BilledCost",
    "EffectiveCost",
    "ListCost",
    "ContractedCost",
    "ListUnitPrice",
    "PricingQuantity",
    "PricingUnit",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "InvoiceId",
    "ProviderName",
    "PublisherName",
    "InvoiceIssuerName",
    "ServiceCategory",
    "ServiceSubcategory",
    "ServiceName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "RegionId",
    "RegionName",
    "SkuId",
    "SkuPriceId",
    "SkuMeter",
    "SkuPriceDetails",
    "Tags",
)
SWITCHYARD_COLUMNS = (
    "x_UsageRecordId",
    # The hash chain the row belongs to: x_Sequence, x_RowHash and x_PrevHash are per partition.
    "x_Partition",
    "x_Sequence",
    "x_PriceBookId",
    "x_PriceBookVersion",
    "x_RowHash",
    "x_PrevHash",
    "x_Unit",
    "x_IdempotencyKey",
    # The exact time the ledger recorded (FOCUS times are whole seconds) and, on a reversal
    # (ChargeClass "Correction"), the x_UsageRecordId it cancels.
    "x_OccurredAt",
    "x_Reverses",
    # The API key whose request caused the row, by its public prefix; empty for none. (FOCUS
    # Tags could carry it too: billing.exports.rows builds them.)
    "x_ApiKey",
    # A response-cache hit's row (BilledCost 0): what the cached answer cost when it was bought,
    # the spend the cache avoided; empty on every other row.
    "x_CostAvoided",
)
COLUMNS = FOCUS_COLUMNS + SWITCHYARD_COLUMNS
DECIMAL_COLUMNS = frozenset(
    {
        "BilledCost",
        "EffectiveCost",
        "ListCost",
        "ContractedCost",
        "ListUnitPrice",
        "PricingQuantity",
        "ConsumedQuantity",
        "x_CostAvoided",
    }
)
# FOCUS DateTimeFormat: whole seconds, "2026-05-04T09:00:00Z"; x_OccurredAt keeps microseconds.
FOCUS_TIME_COLUMNS = frozenset(
    {"ChargePeriodStart", "ChargePeriodEnd", "BillingPeriodStart", "BillingPeriodEnd"}
)
TIME_COLUMNS = FOCUS_TIME_COLUMNS | {"x_OccurredAt"}
INT_COLUMNS = frozenset(
    {"x_UsageRecordId", "x_Sequence", "x_PriceBookId", "x_PriceBookVersion", "x_Reverses"}
)
# Positions in a Row of the values a manifest summarises (and of Tags, spliced into JSON Lines).
COST = COLUMNS.index("BilledCost")
CURRENCY = COLUMNS.index("BillingCurrency")
TAGS = COLUMNS.index("Tags")
PARTITION = COLUMNS.index("x_Partition")
SEQUENCE = COLUMNS.index("x_Sequence")
ROW_HASH = COLUMNS.index("x_RowHash")
PREV_HASH = COLUMNS.index("x_PrevHash")

# Parquet: 28 digits with 9 after the point holds every ledger amount (24, 9) and any total.
PARQUET_PRECISION, PARQUET_SCALE = 28, 9
CHUNK_ROWS = 2000  # rows per database fetch and per streamed chunk
PARQUET_BATCH_ROWS = 10_000  # rows per Parquet record batch (and row group)

Row = tuple[Any, ...]  # one export row, values in COLUMNS order


def iso_text(value: datetime) -> str:
    """A time as UTC text with always six fractional digits: one fixed-width format for every row
    (and PostgreSQL's COPY path writes the very same text, see billing.exports.postgres)."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def focus_time_text(value: datetime) -> str:
    """A FOCUS time as text: UTC, whole seconds (FOCUS's DateTimeFormat has no fraction)."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
