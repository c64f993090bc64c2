"""accelerator_time_bill: accelerator-seconds become one priced, idempotent accelerator-hour row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from billing.models import LedgerHead, Unit, UsageRecord
from billing.resource_bills import accelerator_time_bill
from billing.services import NoPriceError
from registry.models import Cluster
from tests.factories import make_cluster, make_deployment, make_price

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def _bill(cluster: Cluster, **overrides: Any) -> UsageRecord:
    fields: dict[str, Any] = {
        "cluster": cluster,
        "seconds": Decimal("12.345"),
        "accelerators": 2,
        "subject_type": "training_run",
        "subject_id": "7",
        "idempotency_key": "training_run:7/learner:0/g0/c0",
        "at": T0,
        "description": "training run #7 learner 0 g0 chunk 0",
    }
    fields.update(overrides)
    return accelerator_time_bill(**fields)


def _priced(price: str) -> Cluster:
    cluster = make_cluster(price=None)
    make_price(cluster=cluster, unit_price=Decimal(price), effective_from=T0 - timedelta(days=1))
    return cluster


def _cluster_with_two_prices() -> Cluster:
    cluster = make_cluster(price=None)
    make_price(cluster=cluster, unit_price=Decimal("1.250000"), effective_from=T0 - timedelta(days=10))
    make_price(cluster=cluster, unit_price=Decimal("3.000000"), effective_from=T0 + timedelta(hours=1))
    return cluster


def test_it_writes_seconds_over_3600_times_accelerators_at_the_price_version_in_force() -> None:
    cluster = _cluster_with_two_prices()

    row = _bill(cluster)

    stored = UsageRecord.objects.get()
    assert stored.pk == row.pk
    assert stored.unit == Unit.ACCELERATOR_HOUR
    # 12.345 s / 3600 × 2 = 0.0068583333…, stored to the ledger's 9 places (half-even).
    assert stored.quantity == Decimal("0.006858333")
    # The amount is the stored quantity × the unit price, rounded once: 0.00857291625.
    assert stored.unit_price == Decimal("1.250000")
    assert stored.amount == Decimal("0.008572916")
    assert stored.price_book is not None and stored.price_book.version == 1
    assert (stored.cluster, stored.provider) == (cluster, cluster.provider)
    assert (stored.subject_type, stored.subject_id) == ("training_run", "7")
    assert stored.idempotency_key == "training_run:7/learner:0/g0/c0"
    assert stored.occurred_at == T0
    assert stored.description == "training run #7 learner 0 g0 chunk 0"


def test_time_held_after_a_price_change_is_billed_at_the_new_version() -> None:
    cluster = _cluster_with_two_prices()

    row = _bill(cluster, at=T0 + timedelta(hours=2), idempotency_key="later")

    assert row.price_book is not None and row.price_book.version == 2
    assert row.unit_price == Decimal("3.000000")
    assert row.amount == Decimal("0.020574999")


def test_calling_it_twice_with_the_same_key_writes_one_row() -> None:
    cluster = _cluster_with_two_prices()

    first = _bill(cluster)
    sequence = LedgerHead.objects.get().last_sequence
    again = _bill(cluster, seconds=Decimal("99.000"))

    assert again.pk == first.pk and again.quantity == first.quantity
    assert UsageRecord.objects.count() == 1
    assert LedgerHead.objects.get().last_sequence == sequence


def test_one_accelerator_bills_the_seconds_alone_and_zero_seconds_write_a_zero_row() -> None:
    cluster = _priced("1.100000")

    one = _bill(cluster, seconds=Decimal("0.9"), accelerators=1, idempotency_key="probe_job:1")
    zero = _bill(cluster, seconds=Decimal("0.0"), accelerators=1, idempotency_key="probe_job:2")

    assert one.quantity == Decimal("0.000250000") and one.amount == Decimal("0.000275000")
    assert zero.quantity == 0 and zero.amount == 0
    assert UsageRecord.objects.count() == 2


def test_serving_time_carries_the_deployment_and_its_model() -> None:
    cluster = _priced("1.800000")
    deployment = make_deployment(hosting_cluster=cluster)

    row = _bill(
        cluster,
        seconds=Decimal("90.0"),
        subject_type="deployment_hosting",
        subject_id=str(deployment.pk),
        idempotency_key=f"hosting:{deployment.pk}:{T0.isoformat()}",
        deployment=deployment,
        model=deployment.model,
    )

    assert (row.deployment, row.model, row.cluster) == (deployment, deployment.model, cluster)
    assert row.quantity == Decimal("0.050000000") and row.amount == Decimal("0.090000000")


def test_without_a_price_in_force_it_raises_and_writes_nothing() -> None:
    unpriced = make_cluster(price=None)

    with pytest.raises(NoPriceError):
        _bill(unpriced)

    assert not UsageRecord.objects.exists()
