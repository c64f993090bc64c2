"""Builders for inference tests: priced deployments behind loopback providers, routed workflows."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.contrib.auth.models import User

from bench.mockprovider import MockProviderServer
from billing.models import Unit
from registry.models import Deployment, Provider, Workflow
from tests.factories import make_deployment, make_price, make_provider, make_workflow

IN_PRICE = Decimal("1.000000")  # $ per 1M input tokens
OUT_PRICE = Decimal("3.000000")


def priced_deployment(
    server: MockProviderServer | None = None,
    *,
    base_url: str = "",
    in_price: Decimal = IN_PRICE,
    out_price: Decimal = OUT_PRICE,
    provider: Provider | None = None,
    **overrides: Any,
) -> Deployment:
    provider = provider or make_provider(kind=Provider.Kind.OPENAI_COMPATIBLE)
    deployment = make_deployment(
        provider=provider, base_url=server.base_url if server else base_url, **overrides
    )
    make_price(unit=Unit.INPUT_TOKENS_1M, unit_price=in_price, deployment=deployment)
    make_price(unit=Unit.OUTPUT_TOKENS_1M, unit_price=out_price, deployment=deployment)
    return deployment


def routed_workflow(owner: User, deployments: list[Deployment], **policy: Any) -> Workflow:
    return make_workflow(owner=owner, deployments=deployments, **policy)
