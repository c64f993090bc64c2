"""Daily rollups of the ledger, so dashboards never scan raw usage.

`rollups_update` folds the ledger rows after a watermark (the last chained
sequence already counted) into DailyRollup, moving the watermark in the same
transaction: run it twice, or kill it half-way, and every row is counted
exactly once. Ledger sequences are handed out under the chain's head lock and
committed with it, so the rows up to the committed head are all visible.
The ledger has several partitions (one hash chain, head and watermark each):
every call without a `partition` covers every partition that has a head row.
`rollups_rebuild` recomputes everything from the ledger; a test checks it
reproduces the incremental result exactly.
"""

from __future__ import annotations

import hashlib
from datetime import UTC
from typing import Any

from django.db import transaction
from django.db.models import Case, CharField, Count, F, Q, QuerySet, Sum, Value, When
from django.db.models.functions import TruncDate

from billing.models import DailyRollup, LedgerHead, RollupWatermark, UsageRecord

DIMENSIONS = (
    "day",
    "provider_id",
    "cluster_id",
    "deployment_id",
    "model_id",
    "workflow_id",
    "training_run_id",
    "team",
    "unit",
    "currency",
    "api_key_id",
)
# Added after rollups were written: in the key only when set, so a rollup row of spend no key
# caused keeps the key it always had (an incremental fold after the upgrade adds to it).
_LATER_DIMENSIONS = ("api_key_id",)


def rollup_dims_key(values: dict[str, Any]) -> str:
    text = "|".join(
        "" if values[d] is None else str(values[d]) for d in DIMENSIONS if d not in _LATER_DIMENSIONS
    )
    for d in _LATER_DIMENSIONS:
        if values[d] is not None:
            text += f"|{d}={values[d]}"
    return hashlib.sha256(text.encode()).hexdigest()


def with_rollup_dimensions(rows: QuerySet[UsageRecord]) -> QuerySet[UsageRecord]:
    """Ledger rows annotated with the two rollup dimensions they do not store: UTC day and run."""
    return rows.annotate(
        day=TruncDate("occurred_at", tzinfo=UTC),
        training_run_id=Case(
            When(subject_type="training_run", then=F("subject_id")),
            default=Value(""),
            output_field=CharField(),
        ),
    )


def _grouped(rows: QuerySet[UsageRecord]) -> QuerySet[Any]:
    """Ledger rows summed per rollup dimension, by the database."""
    return (
        with_rollup_dimensions(rows)
        .values(*DIMENSIONS)
        .annotate(quantity_sum=Sum("quantity"), amount_sum=Sum("amount"), rows=Count("id"))
        .order_by()
    )


def ledger_partitions() -> list[str]:
    """Every ledger partition (one with a head row: a writer creates it before its first row)."""
    return list(LedgerHead.objects.order_by("partition").values_list("partition", flat=True))


def unfolded_rows() -> Q:
    """Ledger rows after each partition's rollup watermark: the tail the rollups do not hold yet.

    One (partition, sequence > watermark) range per partition, each served by the
    usage_chain_position index; a partition without a watermark has folded nothing.
    """
    marks = dict(RollupWatermark.objects.values_list("partition", "last_sequence"))
    tail = Q(pk__in=[])
    for partition in ledger_partitions():
        tail |= Q(partition=partition, sequence__gt=marks.get(partition, 0))
    return tail


def _lock_watermarks(partitions: list[str]) -> dict[str, RollupWatermark]:
    """Lock every watermark row (creating those missing): one fold at a time, whatever its partition.

    Folds of two partitions may touch the same DailyRollup rows (the same day and
    dimensions), and both could try to create the same new one; holding all the
    watermark locks, taken in one order, serialises them without deadlocks.
    """
    RollupWatermark.objects.bulk_create(
        [RollupWatermark(partition=p) for p in partitions], ignore_conflicts=True
    )
    return {m.partition: m for m in RollupWatermark.objects.select_for_update().order_by("partition")}


def rollups_update(*, partition: str | None = None, batch_size: int = 100_000) -> int:
    """Fold new ledger rows into the rollups; returns how many rows were folded.

    Every partition with a head row, or only `partition`.
    """
    partitions = [partition] if partition is not None else ledger_partitions()
    return sum(_update_partition(p, batch_size) for p in partitions)


def _update_partition(partition: str, batch_size: int) -> int:
    folded = 0
    while True:
        with transaction.atomic():
            mark = _lock_watermarks([partition])[partition]
            head = LedgerHead.objects.filter(partition=partition).first()
            upto = min(head.last_sequence if head else 0, mark.last_sequence + batch_size)
            if upto <= mark.last_sequence:
                return folded
            rows = UsageRecord.objects.filter(
                partition=partition, sequence__gt=mark.last_sequence, sequence__lte=upto
            )
            _fold(list(_grouped(rows)))
            folded += upto - mark.last_sequence
            mark.last_sequence = upto
            mark.save(update_fields=["last_sequence"])


def _fold(groups: list[dict[str, Any]]) -> None:
    by_key = {rollup_dims_key(g): g for g in groups}
    existing = {r.dims_key: r for r in DailyRollup.objects.select_for_update().filter(dims_key__in=by_key)}
    changed, created = [], []
    for key, group in by_key.items():
        rollup = existing.get(key)
        if rollup is None:
            created.append(
                DailyRollup(
                    dims_key=key,
                    **{d: group[d] for d in DIMENSIONS},
                    quantity=group["quantity_sum"],
                    amount=group["amount_sum"],
                    row_count=group["rows"],
                )
            )
        else:
            rollup.quantity += group["quantity_sum"]
            rollup.amount += group["amount_sum"]
            rollup.row_count += group["rows"]
            changed.append(rollup)
    DailyRollup.objects.bulk_create(created, batch_size=2000)
    DailyRollup.objects.bulk_update(changed, ["quantity", "amount", "row_count"], batch_size=2000)


def rollups_rebuild() -> int:
    """Drop the rollups and recompute them from the whole ledger, every partition.

    Always all partitions: a DailyRollup row sums rows of every partition, so one
    partition's share cannot be taken out of it alone.
    """
    with transaction.atomic():
        partitions = ledger_partitions()
        _lock_watermarks(partitions)
        DailyRollup.objects.all().delete()
        RollupWatermark.objects.all().update(last_sequence=0)
        return rollups_update()
