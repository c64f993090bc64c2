"""Daily rollups: incremental, idempotent, and exactly what a rebuild from the ledger gives."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.management import call_command
from django.db.models import Sum

from billing.exports.columns import COLUMNS
from billing.exports.filters import ExportFilterError, export_filters_parse
from billing.exports.rows import export_rows
from billing.models import DailyRollup, RollupWatermark, Unit, UsageRecord
from billing.rollups import DIMENSIONS, rollups_rebuild, rollups_update
from billing.selectors import spend_grouped
from billing.services import UsageInput, usage_record_batch, usage_reverse
from registry.models import Cluster
from registry.services import api_token_create
from tests.factories import api_client, make_cluster, make_deployment, make_price, make_workflow

pytestmark = pytest.mark.django_db
DAY = datetime(2026, 5, 4, 9, tzinfo=UTC)


def _snapshot() -> list[tuple[Any, ...]]:
    return sorted(
        DailyRollup.objects.values_list(
            "dims_key", "day", "provider_id", "cluster_id", "workflow_id", "training_run_id", "unit", "currency",
            "quantity", "amount", "row_count",
        )
    )  # fmt: skip


def _bill(
    cluster: Cluster, n: int, *, start: int = 0, subject_type: str = "training_run"
) -> list[UsageRecord]:
    return usage_record_batch(
        items=[
            UsageInput(
                unit=Unit.ACCELERATOR_HOUR,
                quantity=Decimal("0.25"),
                occurred_at=DAY + timedelta(hours=i % 30),  # 09:00 May 4 to 14:00 May 5: two UTC days
                idempotency_key=f"{cluster.slug}:{start + i}",
                subject_type=subject_type,
                subject_id=str(i % 3),
                cluster=cluster,
            )
            for i in range(start, start + n)
        ]
    )


def test_rollups_fold_each_row_once_and_sum_to_the_ledger(operator: Any) -> None:
    a, b = make_cluster(price=None), make_cluster(price=None)
    make_price(cluster=a, unit_price=Decimal("1.200000"), effective_from=DAY - timedelta(days=1))
    make_price(cluster=b, unit_price=Decimal("0.700000"), effective_from=DAY - timedelta(days=1))
    _bill(a, 50)
    _bill(b, 30)
    assert rollups_update() == 80
    assert rollups_update() == 0  # nothing new: a no-op
    first = _snapshot()

    _bill(a, 20, start=50)
    assert rollups_update() == 20
    totals = DailyRollup.objects.aggregate(amount=Sum("amount"), rows=Sum("row_count"))
    assert totals == {
        "amount": UsageRecord.objects.aggregate(s=Sum("amount"))["s"],
        "rows": 100,
    }
    assert RollupWatermark.objects.get(partition="main").last_sequence == 100
    assert _snapshot() != first
    # Per training run (subject id) and per UTC day.
    runs = set(DailyRollup.objects.values_list("training_run_id", flat=True))
    assert runs == {"0", "1", "2"}
    assert set(DailyRollup.objects.values_list("day", flat=True)) == {
        DAY.date(),
        DAY.date() + timedelta(days=1),
    }


def test_a_rebuild_reproduces_the_incremental_rollups_exactly(operator: Any) -> None:
    cluster = make_cluster(price=None)
    make_price(cluster=cluster, unit_price=Decimal("1.100000"), effective_from=DAY - timedelta(days=2))
    # A price change mid-way: history keeps the old price, rollups follow the ledger.
    make_price(cluster=cluster, unit_price=Decimal("1.300000"), effective_from=DAY + timedelta(hours=20))
    rows = _bill(cluster, 40)
    rollups_update(batch_size=7)  # several batches
    usage_reverse(record=rows[3], reason="double billed", occurred_at=DAY + timedelta(hours=2))
    deployment = make_deployment()
    make_price(deployment=deployment, unit=Unit.OUTPUT_TOKENS_1M, unit_price=Decimal("0.6"),
               effective_from=DAY - timedelta(days=2))  # fmt: skip
    workflow = make_workflow(owner=operator, deployments=[deployment])
    usage_record_batch(
        items=[
            UsageInput(unit=Unit.OUTPUT_TOKENS_1M, quantity=Decimal("0.002"), occurred_at=DAY,
                       idempotency_key="req:1", subject_type="inference_request", subject_id="1",
                       deployment=deployment, workflow=workflow)
        ]
    )  # fmt: skip
    rollups_update(batch_size=7)
    incremental = _snapshot()

    assert rollups_rebuild() == 42
    assert _snapshot() == incremental
    call_command("rollups", "rebuild")
    assert _snapshot() == incremental
    assert DailyRollup.objects.filter(workflow=workflow, unit=Unit.OUTPUT_TOKENS_1M).get().amount == Decimal(
        "0.0012"
    )


def test_the_periodic_task_is_declared_on_the_control_queue(settings: Any) -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["billing-rollups"]
    assert entry["task"] == "billing.rollups_update" and entry["options"]["queue"] == "control"
    from billing.tasks import rollups_update_task

    cluster = make_cluster(price=None)
    make_price(cluster=cluster, unit_price=Decimal("1"), effective_from=DAY - timedelta(days=1))
    _bill(cluster, 3)
    assert rollups_update_task() == 3


def test_rollups_and_the_usage_api_and_export_split_spend_per_api_key(operator: Any, auditor: Any) -> None:
    cluster = make_cluster(price=None)
    make_price(cluster=cluster, unit_price=Decimal("2.000000"), effective_from=DAY - timedelta(days=1))
    first, _ = api_token_create(user=operator, name="first")
    second, _ = api_token_create(user=operator, name="second")

    def bill(key: str, api_key_id: int | None, quantity: str) -> None:
        usage_record_batch(
            items=[
                UsageInput(
                    unit=Unit.ACCELERATOR_HOUR,
                    quantity=Decimal(quantity),
                    occurred_at=DAY,
                    idempotency_key=key,
                    subject_type="probe_job",
                    subject_id=key,
                    cluster=cluster,
                    api_key_id=api_key_id,
                )
            ]
        )

    bill("a1", first.pk, "1")
    bill("no-key", None, "0.5")  # spend no key caused keeps the rollup key it always had
    rollups_update()
    bill("a2", first.pk, "1")  # in the ledger tail, not folded yet
    bill("b1", second.pk, "0.25")
    totals = spend_grouped(by=("api_key__prefix",), since_day=DAY.date())
    assert totals == {(first.prefix,): Decimal("4"), (second.prefix,): Decimal("0.5"), (None,): Decimal("1")}
    rollups_update()
    by_key = dict(DailyRollup.objects.values_list("api_key_id").annotate(total=Sum("amount")))
    assert by_key == {first.pk: Decimal("4"), second.pk: Decimal("0.5"), None: Decimal("1")}
    # The rollup of spend no key caused keeps the key it had before keys were a dimension.
    unkeyed = DailyRollup.objects.get(api_key__isnull=True)
    old_dimensions = [getattr(unkeyed, d) for d in DIMENSIONS if d != "api_key_id"]
    old_text = "|".join("" if v is None else str(v) for v in old_dimensions)
    assert unkeyed.dims_key == hashlib.sha256(old_text.encode()).hexdigest()

    client = api_client(auditor)
    rows = client.get("/api/usage-records/", {"api_key": first.prefix}).json()["results"]
    assert sorted(r["subject_id"] for r in rows) == ["a1", "a2"]
    assert {r["api_key"] for r in rows} == {first.prefix}
    bad = client.get("/api/usage-records/", {"api_key": "not a prefix!"})
    assert bad.status_code == 400 and "api_key" in bad.json()
    exported = list(export_rows(filters=export_filters_parse(params={"api_key": second.prefix})))
    assert [row[COLUMNS.index("x_ApiKey")] for row in exported] == [second.prefix]
    with pytest.raises(ExportFilterError):
        export_filters_parse(params={"api_key": "../etc"})
