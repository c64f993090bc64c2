"""How a ledger row reads in FinOps FOCUS 1.2 terms (used by exports and reconciliation).

FOCUS (the FinOps Open Cost and Usage Specification) names the columns finance
tools expect. Switchyard's mapping, in one place:

- ProviderName, PublisherName, InvoiceIssuerName: the provider's display name (slug
  if none); a row with no provider (our own hardware) names the billing account;
- ServiceCategory / ServiceSubcategory: "AI and Machine Learning" / "Generative AI" for
  tokens and requests, "Compute" / "Other (Compute)" for accelerator-hours (training and
  probes on a cluster), "Storage" and "Networking" for the rest;
- ServiceName: "Accelerator compute", "Model inference", "Storage", "Data transfer";
- ConsumedQuantity / ConsumedUnit: what was used, in the unit people count it in
  ("Tokens", as the FOCUS working group's AI examples do, not "1M Tokens");
  PricingQuantity / PricingUnit: the same usage in the unit the price book quotes
  ("1000000 Tokens", so ListUnitPrice x PricingQuantity = ListCost);
- SkuId: what is priced (the target and the unit: "deployment/chat/output_tokens_1m");
  SkuPriceId: the price-book row that priced it (one per price version); SkuMeter names
  the token type ("Output Tokens");
- ResourceId / ResourceName: the cluster slug for compute, the deployment slug for
  inference (slugs are names an operator chose); ResourceType "cluster" or "deployment";
- Tags: team, workflow, subject and training run, built by `focus_tags` alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings

from billing.models import Unit

FOCUS_VERSION = "1.2"

SERVICE_BY_UNIT = {
    Unit.ACCELERATOR_HOUR: "Accelerator compute",
    Unit.INPUT_TOKENS_1M: "Model inference",
    Unit.OUTPUT_TOKENS_1M: "Model inference",
    Unit.CACHED_INPUT_TOKENS_1M: "Model inference",
    Unit.CACHE_WRITE_TOKENS_1M: "Model inference",
    Unit.REASONING_TOKENS_1M: "Model inference",
    Unit.BATCH_INPUT_TOKENS_1M: "Model inference",
    Unit.BATCH_OUTPUT_TOKENS_1M: "Model inference",
    Unit.REQUEST: "Model inference",
    Unit.STORAGE_GB_MONTH: "Storage",
    Unit.EGRESS_GB: "Data transfer",
}


@dataclass(frozen=True)
class UnitTerms:
    """A ledger unit in FOCUS words. consumed_per_priced: ConsumedQuantity per PricingQuantity."""

    service_category: str
    service_subcategory: str
    pricing_unit: str
    consumed_unit: str
    consumed_per_priced: Decimal
    sku_meter: str


_MILLION = Decimal(1_000_000)
_AI, _GENAI = "AI and Machine Learning", "Generative AI"
UNIT_TERMS = {
    Unit.ACCELERATOR_HOUR: UnitTerms(
        "Compute", "Other (Compute)", "Hours", "Hours", Decimal(1), "Accelerator Hours"
    ),
    Unit.INPUT_TOKENS_1M: UnitTerms(_AI, _GENAI, "1000000 Tokens", "Tokens", _MILLION, "Input Tokens"),
    Unit.OUTPUT_TOKENS_1M: UnitTerms(_AI, _GENAI, "1000000 Tokens", "Tokens", _MILLION, "Output Tokens"),
    Unit.CACHED_INPUT_TOKENS_1M: UnitTerms(
        _AI, _GENAI, "1000000 Tokens", "Tokens", _MILLION, "Cached Input Tokens"
    ),
    Unit.CACHE_WRITE_TOKENS_1M: UnitTerms(
        _AI, _GENAI, "1000000 Tokens", "Tokens", _MILLION, "Cache Write Input Tokens"
    ),
    Unit.REASONING_TOKENS_1M: UnitTerms(
        _AI, _GENAI, "1000000 Tokens", "Tokens", _MILLION, "Reasoning Tokens"
    ),
    Unit.BATCH_INPUT_TOKENS_1M: UnitTerms(
        _AI, _GENAI, "1000000 Tokens", "Tokens", _MILLION, "Batch Input Tokens"
    ),
    Unit.BATCH_OUTPUT_TOKENS_1M: UnitTerms(
        _AI, _GENAI, "1000000 Tokens", "Tokens", _MILLION, "Batch Output Tokens"
    ),
    Unit.REQUEST: UnitTerms(_AI, _GENAI, "Requests", "Requests", Decimal(1), "Requests"),
    Unit.STORAGE_GB_MONTH: UnitTerms(
        "Storage", "Object Storage", "GB-Months", "GB-Months", Decimal(1), "Storage"
    ),
    Unit.EGRESS_GB: UnitTerms(
        "Networking", "Network Connectivity", "GB", "GB", Decimal(1), "Data Transfer Out"
    ),
}
_OTHER_TERMS = UnitTerms("Other", "Other (Other)", "Units", "Units", Decimal(1), "Other")
PRICING_UNIT = {unit: terms.pricing_unit for unit, terms in UNIT_TERMS.items()}

CHARGE_CATEGORY = "Usage"  # every ledger row is metered usage; a reversal is its Correction
CHARGE_CLASS_CORRECTION = "Correction"
CHARGE_FREQUENCY = "Usage-Based"

# Tags: each entry names a tag and the export-source field that fills it (see
# billing.exports.rows, and billing.exports.postgres for the SQL that reads the same field).
# A field added to the ledger later (the API key that caused a row) appears in Tags by one
# line here. Empty values are left out: FOCUS asks for keys with non-null values.
TAG_FIELDS: tuple[tuple[str, str], ...] = (
    ("team", "team"),
    ("workflow", "workflow__slug"),
    ("api_key", "api_key__prefix"),
    ("subject", "subject"),
    ("training_run", "training_run"),
)


def unit_terms(unit: str) -> UnitTerms:
    return UNIT_TERMS.get(Unit(unit), _OTHER_TERMS) if unit in Unit.values else _OTHER_TERMS


def focus_tags(values: Mapping[str, Any]) -> str:
    """Tags as FOCUS KeyValueFormat JSON text, from a row's source values (keys of TAG_FIELDS)."""
    tags = {tag: str(values[field]) for tag, field in TAG_FIELDS if values.get(field) not in (None, "")}
    return json.dumps(tags, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class FocusResource:
    service_name: str
    resource_id: str
    resource_type: str


def focus_resource(*, unit: str, cluster_slug: str | None, deployment_slug: str | None) -> FocusResource:
    service = SERVICE_BY_UNIT.get(Unit(unit), "Other") if unit in Unit.values else "Other"
    if cluster_slug:
        return FocusResource(service, cluster_slug, "cluster")
    if deployment_slug:
        return FocusResource(service, deployment_slug, "deployment")
    return FocusResource(service, "", "")


def focus_charge_period(*, start: datetime, end: datetime) -> tuple[datetime, datetime]:
    """FOCUS times are whole seconds (DateTimeFormat has no fraction): the start rounds down, the
    exclusive end rounds up, and a charge at an instant (tokens, requests) gets the second it falls
    in, so the period always holds the charge and is never empty. x_OccurredAt keeps the exact time."""
    floor_start = start.replace(microsecond=0)
    ceil_end = end.replace(microsecond=0) + (timedelta(seconds=1) if end.microsecond else timedelta(0))
    return floor_start, max(ceil_end, floor_start + timedelta(seconds=1))


def focus_billing_period(charge_start: datetime) -> tuple[datetime, datetime]:
    """The UTC calendar month the charge starts in: [first day, first day of the next month)."""
    start = charge_start.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (start + timedelta(days=32)).replace(day=1)
    return start, end


def focus_charge_description(unit: str) -> str:
    """A row's ChargeDescription when the ledger row has none of its own ("Output Tokens (Model inference)")."""
    service = SERVICE_BY_UNIT.get(Unit(unit), "Other") if unit in Unit.values else "Other"
    return f"{unit_terms(unit).sku_meter} ({service})"


def focus_billing_account() -> tuple[str, str]:
    """(BillingAccountId, BillingAccountName): this Switchyard installation, from settings."""
    return settings.FOCUS_BILLING_ACCOUNT_ID, settings.FOCUS_BILLING_ACCOUNT_NAME
