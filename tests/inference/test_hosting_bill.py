from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing.models import Unit, UsageRecord
from inference.serving.hosting import hosting_interval_bill
from tests.factories import make_cluster, make_deployment

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_serving_time_is_billed_at_the_hosting_clusters_price_once_per_interval():
    cluster = make_cluster(price=Decimal("1.800000"))
    deployment = make_deployment(hosting_cluster=cluster)

    row = hosting_interval_bill(
        deployment=deployment, started_at=T0, ended_at=T0 + timedelta(seconds=90), accelerators=2
    )
    again = hosting_interval_bill(
        deployment=deployment, started_at=T0, ended_at=T0 + timedelta(seconds=90), accelerators=2
    )

    assert row is not None and again is not None and again.pk == row.pk
    rows = UsageRecord.objects.filter(deployment=deployment)
    assert rows.count() == 1
    assert row.unit == Unit.ACCELERATOR_HOUR and row.cluster_id == cluster.pk
    # 90 s x 2 accelerators = 0.05 accelerator-hours at $1.80
    assert row.amount == Decimal("0.090000000")


def test_an_empty_interval_bills_nothing_and_an_unhosted_deployment_is_refused():
    deployment = make_deployment(hosting_cluster=make_cluster())
    assert hosting_interval_bill(deployment=deployment, started_at=T0, ended_at=T0) is None
    assert not UsageRecord.objects.filter(deployment=deployment).exists()

    with pytest.raises(ValueError, match="no hosting cluster"):
        hosting_interval_bill(deployment=make_deployment(), started_at=T0, ended_at=T0 + timedelta(seconds=5))
