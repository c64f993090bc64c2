"""A self-hosted deployment's effective price per 1M tokens, from the ledger."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from billing.models import Unit
from billing.rollups import rollups_update
from billing.selfhosted import self_hosted_cost
from billing.services import UsageInput, usage_record_batch
from registry.models import Provider
from tests.factories import make_cluster, make_deployment, make_price, make_provider

pytestmark = pytest.mark.django_db


def test_hosting_hours_over_tokens_served_give_the_effective_price(operator: Any) -> None:
    now = timezone.now()
    since = now - timedelta(days=40)
    cluster = make_cluster(slug="onprem-gpu", price=None, provider=make_provider(kind=Provider.Kind.ON_PREM))
    make_price(cluster=cluster, unit_price=Decimal("1.200000"), effective_from=since)
    local = make_deployment(slug="local-gpt", hosting_cluster=cluster, provider=cluster.provider,
                            base_url="http://127.0.0.1:8100/v1")  # fmt: skip
    for unit in (Unit.INPUT_TOKENS_1M, Unit.OUTPUT_TOKENS_1M):
        make_price(deployment=local, unit=unit, unit_price=Decimal("0"), effective_from=since)

    def bill(unit: Unit, quantity: str, key: str) -> UsageInput:
        return UsageInput(unit=unit, quantity=Decimal(quantity), occurred_at=now - timedelta(hours=1),
                          idempotency_key=key, subject_type="deployment", subject_id=local.slug,
                          cluster=cluster if unit == Unit.ACCELERATOR_HOUR else None, deployment=local)  # fmt: skip

    assert self_hosted_cost(deployment=local, since_day=since.date())[0].per_1m_tokens is None
    usage_record_batch(items=[bill(Unit.ACCELERATOR_HOUR, "10", "h1"), bill(Unit.INPUT_TOKENS_1M, "3", "t1")])
    rollups_update()
    usage_record_batch(items=[bill(Unit.OUTPUT_TOKENS_1M, "1.8", "t2")])  # still in the tail

    [cost] = self_hosted_cost(deployment=local, since_day=since.date())
    assert (cost.currency, cost.accelerator_cost, cost.tokens_millions) == (
        "USD",
        Decimal("12"),
        Decimal("4.8"),
    )
    assert cost.per_1m_tokens == Decimal("2.500000")  # 12.00 / 4.8M tokens


def test_a_trained_models_deployment_also_gets_its_training_cost_amortised_over_the_horizon(
    operator: Any,
) -> None:
    """Issue 18, item 4: hosting-only and with the training cost, side by side."""
    now = timezone.now()
    since = (now - timedelta(days=29)).date()  # a 30-day window: the volume is the month's
    cluster = make_cluster(slug="onprem-gpu", price=None, provider=make_provider(kind=Provider.Kind.ON_PREM))
    make_price(cluster=cluster, unit_price=Decimal("1.000000"), effective_from=now - timedelta(days=40))
    local = make_deployment(slug="local-gpt", hosting_cluster=cluster, provider=cluster.provider,
                            base_url="http://127.0.0.1:8100/v1")  # fmt: skip
    make_price(
        deployment=local,
        unit=Unit.INPUT_TOKENS_1M,
        unit_price=Decimal("0"),
        effective_from=now - timedelta(days=40),
    )
    usage_record_batch(items=[
        UsageInput(unit=unit, quantity=Decimal(quantity), occurred_at=now - timedelta(hours=1),
                   idempotency_key=key, subject_type="deployment", subject_id=local.slug,
                   cluster=cluster if unit == Unit.ACCELERATOR_HOUR else None, deployment=local)
        for unit, quantity, key in ((Unit.ACCELERATOR_HOUR, "10", "h"), (Unit.INPUT_TOKENS_1M, "5", "t"))
    ])  # fmt: skip

    [bought] = self_hosted_cost(deployment=local, since_day=since, horizon_months=12, today=now.date())
    assert bought.per_1m_tokens == Decimal("2.000000") and bought.per_1m_amortised is None  # not trained here

    local.model.training_cost, local.model.produced_by_run_id = Decimal("120"), 7
    local.model.save(update_fields=["training_cost", "produced_by_run_id"])
    [trained] = self_hosted_cost(deployment=local, since_day=since, horizon_months=12, today=now.date())
    # 10 accelerator-hours at 1.00 over 5M tokens: 2.00 per 1M hosting-only; 120 over 12 months
    # is 10 a month, over the 5M tokens this 30-day window served: 2.00 more per 1M.
    assert (trained.per_1m_tokens, trained.per_1m_amortised, trained.horizon_months) == (
        Decimal("2.000000"),
        Decimal("4.000000"),
        12,
    )
    assert self_hosted_cost(deployment=local, since_day=since)[0].per_1m_amortised is None  # no horizon asked
