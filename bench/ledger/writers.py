"""`bench ledger`'s realistic writers: many small transactions at once, with budgets to keep.

8 writers (processes by default: each its own interpreter and database connection; or
threads, where Python's GIL shares one core among them) each append transactions of 1 to
10 rows through billing.services.usage_record_batch, without naming a partition, so the
figure is whatever the writer does with partitions. Each row belongs to a workflow and a
team that both have an active budget, so every transaction also moves budget totals.
Two shapes, as in production: a gateway request (token and request rows, provider-wide
prices, one warm PriceResolver per writer as the router keeps) and training chunks
(accelerator-hours on a cluster).
"""

from __future__ import annotations

import multiprocessing
import random
import statistics
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection, connections
from django.utils import timezone

from billing.models import Budget, Unit
from billing.selectors import PriceResolver
from billing.services import UsageInput, price_book_publish, usage_record_batch
from registry.models import Cluster, Provider, Team, Workflow

WRITERS = 8
TOKEN_UNITS = (Unit.INPUT_TOKENS_1M, Unit.OUTPUT_TOKENS_1M, Unit.CACHED_INPUT_TOKENS_1M,
               Unit.REASONING_TOKENS_1M, Unit.REQUEST)  # fmt: skip


@dataclass(frozen=True)
class WriterSeed:
    """Ids only: a writer process re-reads its rows' targets through its own connection."""

    provider_id: int
    cluster_ids: tuple[int, ...]
    workflow_ids: tuple[int, ...]


def writers_seed(*, clusters: list[Cluster], start: datetime) -> WriterSeed:
    """Workflows in four teams, a budget on every workflow and team, token prices for the gateway shape."""
    provider = clusters[0].provider
    for unit in TOKEN_UNITS:
        price_book_publish(unit=unit, unit_price=Decimal("0.6"), effective_from=start, provider=provider)
    owner = get_user_model().objects.create(username="bench-owner")
    teams = [Team.objects.create(slug=f"bench-team-{t}", name=f"Bench team {t}") for t in range(4)]
    workflows = [
        Workflow.objects.create(slug=f"bench-wf-{w}", owner=owner, team=teams[w % 4]) for w in range(8)
    ]
    # Limits far above what the benchmark spends: no threshold alert (and no delivery task) fires.
    for workflow in workflows:
        Budget.objects.create(name=f"bench-{workflow.slug}", scope=Budget.Scope.WORKFLOW, workflow=workflow,
                              limit_amount=Decimal("1000000000"), thresholds=[50, 80, 100])  # fmt: skip
    for team in range(4):
        Budget.objects.create(name=f"bench-team-{team}", scope=Budget.Scope.TEAM, team=f"bench-team-{team}",
                              limit_amount=Decimal("1000000000"), thresholds=[50, 80, 100])  # fmt: skip
    return WriterSeed(provider.pk, tuple(c.pk for c in clusters), tuple(w.pk for w in workflows))


def _transaction(
    rng: random.Random, writer: int, number: int, provider: Provider, clusters: list[Cluster],
    workflows: list[Workflow],
) -> list[UsageInput]:  # fmt: skip
    size = rng.randint(1, 10)
    workflow = rng.choice(workflows)
    now = timezone.now() - timedelta(seconds=1)
    key = f"small:{writer}:{number}"
    if rng.random() < 0.5:  # a gateway request: its token and request rows
        return [
            UsageInput(
                unit=TOKEN_UNITS[i % len(TOKEN_UNITS)],
                quantity=Decimal(rng.randint(1, 4000)) / 1_000_000,
                occurred_at=now,
                idempotency_key=f"{key}:{i}",
                subject_type="inference_request",
                subject_id=key,
                provider=provider,
                workflow=workflow,
            )  # fmt: skip
            for i in range(size)
        ]
    cluster = rng.choice(clusters)
    return [  # training chunks finishing together
        UsageInput(
            unit=Unit.ACCELERATOR_HOUR,
            quantity=Decimal(rng.randint(30, 600)) / 3600,
            occurred_at=now,
            idempotency_key=f"{key}:{i}",
            subject_type="training_run",
            subject_id=str(writer),
            cluster=cluster,
            workflow=workflow,
        )  # fmt: skip
        for i in range(size)
    ]


def _write(
    writer: int, transactions: int, seed: WriterSeed, barrier: Any
) -> tuple[int, float, float, list[float]]:
    """One writer's run: (rows, start, end, per-transaction milliseconds); its own connection."""
    try:
        try:
            provider = Provider.objects.get(pk=seed.provider_id)
            clusters = list(Cluster.objects.filter(pk__in=seed.cluster_ids).select_related("provider"))
            workflows = list(Workflow.objects.select_related("team").filter(pk__in=seed.workflow_ids))
            rng = random.Random(writer)  # noqa: S311 (shapes, not secrets)
            prices = PriceResolver()
            batches = [
                _transaction(rng, writer, n, provider, clusters, workflows) for n in range(transactions)
            ]
        except BaseException:
            barrier.abort()  # the others would wait for this writer forever
            raise
        barrier.wait()
        began = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
        latencies = []
        for items in batches:
            t0 = time.perf_counter()
            usage_record_batch(items=items, prices=prices)
            latencies.append((time.perf_counter() - t0) * 1000)
        return sum(len(b) for b in batches), began, time.perf_counter(), latencies
    finally:
        connection.close()


def _in_process(writer: int, transactions: int, seed: WriterSeed, barrier: Any, results: Any) -> None:
    try:
        results.put(_write(writer, transactions, seed, barrier))
    except BaseException as exc:
        results.put(f"writer {writer}: {type(exc).__name__}: {exc}")  # the parent raises it
        raise


def writers_run(*, seed: WriterSeed, rows: int, mode: str = "processes") -> dict[str, Any]:
    """Run WRITERS concurrent writers appending about `rows` rows in all; their combined rate."""
    transactions = max(1, round(rows / WRITERS / 5.5))  # 1 to 10 rows: 5.5 on average
    if mode == "threads":
        barrier: Any = threading.Barrier(WRITERS)
        outcomes: list[Any] = [None] * WRITERS

        def run(w: int) -> None:
            outcomes[w] = _write(w, transactions, seed, barrier)

        threads = [threading.Thread(target=run, args=(w,)) for w in range(WRITERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if any(o is None for o in outcomes):
            raise RuntimeError("a writer thread failed")
    else:
        # Forked children must not share the parent's socket to PostgreSQL.
        connections.close_all()
        context = multiprocessing.get_context("fork")
        barrier = context.Barrier(WRITERS)
        queue = context.Queue()
        processes = [
            context.Process(target=_in_process, args=(w, transactions, seed, barrier, queue))
            for w in range(WRITERS)
        ]
        for process in processes:
            process.start()
        outcomes = [queue.get(timeout=3600) for _ in processes]
        for process in processes:
            process.join()
        failed = [o for o in outcomes if isinstance(o, str)]
        if failed:
            raise RuntimeError("; ".join(failed))
    written = sum(o[0] for o in outcomes)
    seconds = max(o[2] for o in outcomes) - min(o[1] for o in outcomes)
    latencies = [ms for o in outcomes for ms in o[3]]
    return {
        "mode": mode,
        "writers": WRITERS,
        "transactions": len(latencies),
        "rows": written,
        "rows_per_s": round(written / seconds, 1),
        "transaction_p50_ms": round(statistics.median(latencies), 2),
        "transaction_p95_ms": round(statistics.quantiles(latencies, n=20)[-1], 2),
    }
