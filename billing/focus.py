"""How a ledger row reads in FinOps FOCUS terms (used by exports and reconciliation).

FOCUS (the FinOps Open Cost and Usage Specification) names the columns finance
tools expect: ProviderName, ServiceName, ResourceId, ResourceType,
PricingUnit, ... Switchyard's mapping, in one place:

- ProviderName: the provider's display name (slug if none);
- ServiceName: "Accelerator compute" for accelerator-hours, "Model inference"
  for token and request units, "Storage" and "Data transfer" for the rest;
- ResourceId: the cluster slug for compute, the deployment slug for inference;
- ResourceType: "cluster" or "deployment".
"""

from __future__ import annotations

from dataclasses import dataclass

from billing.models import Unit

SERVICE_BY_UNIT = {
    Unit.ACCELERATOR_HOUR: "Accelerator compute",
    Unit.INPUT_TOKENS_1M: "Model inference",
    Unit.OUTPUT_TOKENS_1M: "Model inference",
    Unit.CACHED_INPUT_TOKENS_1M: "Model inference",
    Unit.REASONING_TOKENS_1M: "Model inference",
    Unit.REQUEST: "Model inference",
    Unit.STORAGE_GB_MONTH: "Storage",
    Unit.EGRESS_GB: "Data transfer",
}
PRICING_UNIT = {
    Unit.ACCELERATOR_HOUR: "Accelerator-Hours",
    Unit.INPUT_TOKENS_1M: "1M Input Tokens",
    Unit.OUTPUT_TOKENS_1M: "1M Output Tokens",
    Unit.CACHED_INPUT_TOKENS_1M: "1M Cached Input Tokens",
    Unit.REASONING_TOKENS_1M: "1M Reasoning Tokens",
    Unit.REQUEST: "Requests",
    Unit.STORAGE_GB_MONTH: "GB-Months",
    Unit.EGRESS_GB: "GB",
}


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


def focus_pricing_unit(unit: str) -> str:
    return PRICING_UNIT.get(Unit(unit), unit) if unit in Unit.values else unit
