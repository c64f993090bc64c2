"""Parallel ledger writers: each takes a free partition's head (its own hash chain), so one
writer's open transaction never blocks another; keys stay unique across partitions and budget
periods count every row once (PostgreSQL: SKIP LOCKED)."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest
from django.db import connections, transaction
from django.db.models import Sum
from django.utils import timezone

from billing.budgets import budget_period_bounds, budget_save
from billing.models import Budget, BudgetPeriod, LedgerHead, Unit, UsageRecord
from billing.selectors import ledger_verify
from billing.services import ledger_partition_names, usage_record
from tests.factories import make_cluster

# Partitioned writers need SKIP LOCKED: PostgreSQL.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def _bill(cluster, key: str) -> UsageRecord:  # type: ignore[no-untyped-def]
    return usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal("1"),
        occurred_at=timezone.now(),
        idempotency_key=key,
        subject_type="test",
        subject_id=key,
        cluster=cluster,
    )


def test_partition_names_follow_the_setting(settings) -> None:  # type: ignore[no-untyped-def]
    settings.LEDGER_PARTITIONS = 3
    assert ledger_partition_names() == ["main", "main-1", "main-2"]
    settings.LEDGER_PARTITIONS = 1
    assert ledger_partition_names() == ["main"]


def test_a_writer_holding_a_head_does_not_block_another(settings) -> None:  # type: ignore[no-untyped-def]
    settings.LEDGER_PARTITIONS = 2
    cluster = make_cluster()
    _bill(cluster, "opening")  # the first write creates the partitions' heads
    held, release = threading.Event(), threading.Event()
    first: list[UsageRecord] = []

    def slow_writer() -> None:
        try:
            with transaction.atomic():
                first.append(_bill(cluster, "slow"))
                held.set()
                release.wait(60)
        finally:
            connections.close_all()

    thread = threading.Thread(target=slow_writer)
    thread.start()
    assert held.wait(60)
    # The slow writer's transaction holds one head: this write takes the other and commits now.
    second = _bill(cluster, "fast")
    assert UsageRecord.objects.filter(idempotency_key="fast").exists()
    release.set()
    thread.join(60)
    assert {first[0].partition, second.partition} == {"main", "main-1"}
    assert first[0].sequence + second.sequence == 3  # one chain had the opening row, the other none
    for head in LedgerHead.objects.all():
        assert ledger_verify(partition=head.partition).ok


def test_the_same_key_written_on_two_partitions_at_once_is_billed_once(settings) -> None:  # type: ignore[no-untyped-def]
    settings.LEDGER_PARTITIONS = 2
    cluster = make_cluster()
    _bill(cluster, "opening")  # the first write creates the partitions' heads
    held, release = threading.Event(), threading.Event()
    results: list[UsageRecord] = []

    def holder() -> None:
        try:
            with transaction.atomic():
                results.append(_bill(cluster, "same-key"))
                held.set()
                release.wait(60)
        finally:
            connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(60)
    # This writer takes the other partition, finds no committed row for the key, and its insert
    # waits on the unique index until the holder commits; then it returns the holder's row.
    threading.Timer(0.5, release.set).start()
    again = _bill(cluster, "same-key")
    thread.join(60)
    assert UsageRecord.objects.filter(idempotency_key="same-key").count() == 1
    assert again.pk == results[0].pk
    for head in LedgerHead.objects.all():
        assert ledger_verify(partition=head.partition).ok


def test_eight_writers_spread_over_partitions_and_budgets_count_every_row_once(settings) -> None:  # type: ignore[no-untyped-def]
    settings.LEDGER_PARTITIONS = 4
    cluster = make_cluster(price=Decimal("2"))
    budget = budget_save(
        budget=Budget(
            name="cluster month", scope=Budget.Scope.CLUSTER, cluster=cluster, limit_amount=Decimal("1000")
        )
    )
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def writer(n: int) -> None:
        try:
            start.wait()
            for i in range(15):
                _bill(cluster, f"w{n}-{i}")
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    rows = UsageRecord.objects.filter(cluster=cluster)
    assert rows.count() == 120
    assert rows.values("partition").distinct().count() > 1  # the writers did not all queue on one head
    for head in LedgerHead.objects.all():
        assert ledger_verify(partition=head.partition).ok
    start_at, _ = budget_period_bounds(budget=budget, at=timezone.now()) or (None, None)
    period = BudgetPeriod.objects.get(budget=budget, start=start_at)
    assert period.spent == rows.aggregate(t=Sum("amount"))["t"] == Decimal("240")
