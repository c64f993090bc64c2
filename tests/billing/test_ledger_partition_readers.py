"""A ledger of several partitions (one hash chain each): every reader covers them all.

Exports merge the partitions by time from a snapshot of every head, the manifest names
each head, rollups and the dashboard count every partition, and `ledger verify` names the
partition of a tampered row.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db.models import Sum

from billing.exports import (
    ExportFilterError,
    export_filters_parse,
    export_rows,
    export_stream,
    export_verify,
    export_write_files,
)
from billing.exports.columns import COLUMNS
from billing.models import DailyRollup, LedgerHead, RollupWatermark, Unit, UsageRecord
from billing.rollups import rollups_rebuild, rollups_update
from billing.selectors import ledger_verify, spend_per_provider_per_day
from billing.services import UsageInput, usage_record_batch
from registry.models import Cluster
from tests.billing.test_ledger_chain import _raw
from tests.factories import make_cluster, make_price

pytestmark = pytest.mark.django_db
DAY = datetime(2026, 5, 4, 9, tzinfo=UTC)


def _append(cluster: Cluster, partition: str, minutes: list[int], *, key: str) -> list[UsageRecord]:
    """Rows in `partition` at DAY + each of `minutes` (one transaction)."""
    return usage_record_batch(
        partition=partition,
        items=[
            UsageInput(
                unit=Unit.ACCELERATOR_HOUR,
                quantity=Decimal("0.5"),
                occurred_at=DAY + timedelta(minutes=m),
                idempotency_key=f"{key}:{m}",
                subject_type="training_run",
                subject_id=key,
                cluster=cluster,
            )
            for m in minutes
        ],
    )


@pytest.fixture
def cluster() -> Cluster:
    found = make_cluster(price=None)
    make_price(cluster=found, unit_price=Decimal("2"), effective_from=DAY - timedelta(days=1))
    return found


@pytest.fixture
def two_partitions(cluster: Cluster) -> None:
    """Interleaved in time: main at even minutes, east at odd ones and one tie at minute 4."""
    _append(cluster, "main", [0, 2, 4, 6], key="m")
    _append(cluster, "east", [1, 3, 4, 5], key="e")


def _order(rows: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """(partition, sequence) pairs sorted the way an export must be: time, partition, sequence."""
    by_key = {(r.partition, r.sequence): r for r in UsageRecord.objects.all()}
    return sorted(rows, key=lambda ps: (by_key[ps].occurred_at, ps[0], ps[1]))


def _csv_positions(data: bytes) -> list[tuple[str, int]]:
    return [(r["x_Partition"], int(r["x_Sequence"])) for r in csv.DictReader(io.StringIO(data.decode()))]


def test_an_export_holds_every_partition_merged_by_time_and_its_manifest_names_both_heads(
    two_partitions: None, tmp_path: Path
) -> None:
    expected = _order(list(UsageRecord.objects.values_list("partition", "sequence")))
    assert len(expected) == 8 and expected[4:6] == [("east", 3), ("main", 3)]  # the tie at minute 4

    # The database's COPY path, the Python writer and every file of a job agree on the order.
    streamed = _csv_positions(b"".join(export_stream(filters=export_filters_parse(params={}), fmt="csv")))
    assert streamed == expected
    python_rows = export_rows(filters=export_filters_parse(params={}).pinned())
    assert [
        (r[COLUMNS.index("x_Partition")], r[COLUMNS.index("x_Sequence")]) for r in python_rows
    ] == expected

    manifest = export_write_files(filters=export_filters_parse(params={}), formats=["csv", "jsonl"],
                                  directory=tmp_path)  # fmt: skip
    assert _csv_positions((tmp_path / "usage.csv").read_bytes()) == expected
    jsonl = [json.loads(line) for line in (tmp_path / "usage.jsonl").read_text().splitlines()]
    assert [(r["x_Partition"], r["x_Sequence"]) for r in jsonl] == expected
    heads = {
        h.partition: {"sequence": h.last_sequence, "hash": h.last_hash} for h in LedgerHead.objects.all()
    }
    assert manifest["heads"] == heads and set(heads) == {"main", "east"}
    assert manifest["filters"]["through"] == {"east": 4, "main": 4}
    assert manifest["partitions"]["east"] == {
        "row_count": 4, "first_sequence": 1, "first_row_hash": UsageRecord.objects.get(partition="east", sequence=1).row_hash,
        "last_sequence": 4, "last_row_hash": heads["east"]["hash"],
    }  # fmt: skip
    checks = export_verify(manifest_path=tmp_path / "manifest.json")
    assert all(c.ok for c in checks), [c.line() for c in checks if not c.ok]
    assert any(c.name == "usage.csv chains" and "2 partitions link up" in c.detail for c in checks)

    # A row re-linked in the file: its chain no longer links up, partition named.
    east_2 = UsageRecord.objects.get(partition="east", sequence=2)
    text = (tmp_path / "usage.csv").read_text()
    (tmp_path / "usage.csv").write_text(
        text.replace(f"{east_2.prev_hash},accelerator_hour", "f" * 64 + ",accelerator_hour")
    )
    chains = next(
        c for c in export_verify(manifest_path=tmp_path / "manifest.json") if c.name == "usage.csv chains"
    )
    assert not chains.ok and "partition east: 1 rows do not link" in chains.detail


def test_the_snapshot_excludes_rows_appended_to_any_partition_after_the_heads_were_read(
    two_partitions: None, cluster: Cluster, tmp_path: Path
) -> None:
    pinned = export_filters_parse(params={}).pinned()
    before = set(UsageRecord.objects.values_list("id", flat=True))
    _append(cluster, "main", [1, 7], key="late-m")  # minute 1 sorts among the pinned rows
    _append(cluster, "east", [8], key="late-e")
    _append(cluster, "west", [2], key="late-w")  # a partition begun after the pin
    assert UsageRecord.objects.count() == 12

    streamed = csv.DictReader(io.StringIO(b"".join(export_stream(filters=pinned, fmt="csv")).decode()))
    assert {int(r["x_UsageRecordId"]) for r in streamed} == before
    assert {r[COLUMNS.index("x_UsageRecordId")] for r in export_rows(filters=pinned)} == before
    manifest = export_write_files(filters=pinned, formats=["parquet"], directory=tmp_path)
    assert manifest["row_count"] == 8 and set(manifest["heads"]) == {"main", "east"}
    assert manifest["heads"]["main"]["sequence"] == 4
    assert manifest["heads"]["main"]["hash"] == UsageRecord.objects.get(partition="main", sequence=4).row_hash
    assert all(c.ok for c in export_verify(manifest_path=tmp_path / "manifest.json"))


def test_one_partition_can_be_chosen_and_an_unknown_one_is_refused(
    two_partitions: None, tmp_path: Path
) -> None:
    only_east = export_filters_parse(params={"partition": "east"})
    streamed = _csv_positions(b"".join(export_stream(filters=only_east, fmt="csv")))
    assert streamed == [("east", 1), ("east", 2), ("east", 3), ("east", 4)]
    manifest = export_write_files(filters=only_east, formats=["csv"], directory=tmp_path)
    assert set(manifest["heads"]) == set(manifest["partitions"]) == {"east"}
    with pytest.raises(ExportFilterError) as raised:
        export_filters_parse(params={"partition": "nowhere"})
    assert raised.value.errors == {"partition": ["no ledger partition nowhere"]}


def test_rollups_and_the_dashboard_count_every_partition(two_partitions: None, cluster: Cluster) -> None:
    assert rollups_update() == 8
    assert dict(RollupWatermark.objects.values_list("partition", "last_sequence")) == {"main": 4, "east": 4}
    folded = DailyRollup.objects.aggregate(amount=Sum("amount"), rows=Sum("row_count"))
    assert folded == {"amount": Decimal("8"), "rows": 8}

    # A tail in both partitions, beyond each one's watermark: the dashboard shows it at once.
    _append(cluster, "east", [30, 31], key="tail-e")
    _append(cluster, "main", [32], key="tail-m")
    spend = spend_per_provider_per_day(since_day=DAY.date())
    assert [(s.day, s.amount) for s in spend] == [(DAY.date(), Decimal("11"))]

    assert rollups_update() == 3
    assert spend_per_provider_per_day(since_day=DAY.date()) == spend
    incremental = sorted(DailyRollup.objects.values_list("dims_key", "amount", "row_count"))
    assert rollups_rebuild() == 11
    assert sorted(DailyRollup.objects.values_list("dims_key", "amount", "row_count")) == incremental


def test_ledger_verify_checks_each_partition_and_names_the_one_with_a_tampered_row(
    two_partitions: None,
) -> None:
    assert ledger_verify(partition="main").ok and ledger_verify(partition="east").ok
    tampered = UsageRecord.objects.get(partition="east", sequence=2)
    _raw("UPDATE billing_usagerecord SET amount = %s WHERE id = %s", [Decimal("0.01"), tampered.pk])

    assert ledger_verify(partition="main").ok
    with pytest.raises(CommandError, match=rf"^ledger east: row id={tampered.pk} sequence=2: .*changed"):
        call_command("ledger", "verify")
