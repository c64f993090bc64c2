"""Learner chunks in-process: claims are idempotent, each chunk is billed once at its cluster's price,
and the syncer records every published version once. (Real workers: tests/integration.)"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db.models import Sum
from django.utils import timezone

from billing.models import UsageRecord
from stack.registry.models import Cluster
from tests.factories import make_cluster, tiny_run_config
from training import orchestrator, services
from training.models import GlobalVersionRecord, LearnerChunk, TrainingLearner, TrainingRun

_config = tiny_run_config


def _healthy(price: str) -> Cluster:
    cluster = make_cluster(price=Decimal(price), accelerator_count=4, capacity=2)
    Cluster.objects.filter(pk=cluster.pk).update(status="healthy", last_heartbeat_at=timezone.now())
    cluster.refresh_from_db()
    return cluster


@pytest.fixture
def placed_run(db: Any, tmp_path: Path) -> TrainingRun:
    _healthy("1.250000")
    _healthy("3.000000")
    run = services.training_run_create(config=_config(), created_by=None, name="chunks")
    services.training_run_place(run_id=run.pk)
    run.refresh_from_db()
    assert run.state == TrainingRun.State.RUNNING, run.reason
    return run


def test_the_same_chunk_run_twice_makes_one_chunk_row_and_one_usage_record(placed_run: TrainingRun) -> None:
    learner = TrainingLearner.objects.get(run=placed_run, index=0)
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@1")
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@2")
    chunks = LearnerChunk.objects.filter(learner=learner)
    assert chunks.count() == 1
    chunk = chunks.get()
    assert chunk.worker_hostname == "w@1" and chunk.billed and chunk.steps > 0
    records = UsageRecord.objects.filter(subject_type="training_run", subject_id=str(placed_run.pk))
    assert records.count() == 1
    assert records.get().idempotency_key == f"training_run:{placed_run.pk}/learner:0/g0/c0"
    learner.refresh_from_db()
    assert learner.steps == chunk.steps and learner.tokens == chunk.tokens
    assert learner.state == TrainingLearner.State.RUNNING and learner.last_report_at is not None


def test_a_chunk_of_an_old_generation_is_a_no_op(placed_run: TrainingRun) -> None:
    learner = TrainingLearner.objects.get(run=placed_run, index=1)
    TrainingLearner.objects.filter(pk=learner.pk).update(generation=1)
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@1")
    assert not LearnerChunk.objects.filter(learner=learner).exists()
    assert not UsageRecord.objects.filter(subject_id=str(placed_run.pk)).exists()


def test_a_cancelled_run_trains_and_bills_nothing_more(placed_run: TrainingRun) -> None:
    services.training_run_cancel(run=placed_run, reason="stop", by=None)
    learner = TrainingLearner.objects.get(run=placed_run, index=0)
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@1")
    assert not LearnerChunk.objects.filter(learner=learner).exists()
    assert not UsageRecord.objects.filter(subject_id=str(placed_run.pk)).exists()


def test_run_cost_is_the_sum_of_chunk_seconds_times_price_to_the_cent(placed_run: TrainingRun) -> None:
    learners = list(TrainingLearner.objects.filter(run=placed_run).select_related("cluster"))
    assert {ln.cluster.slug for ln in learners} == {c.slug for c in Cluster.objects.all()}  # spread
    for seq in range(3):
        for learner in learners:
            orchestrator.learner_chunk_execute(
                learner_id=learner.pk, generation=0, seq=seq, worker_hostname="w@1"
            )
    expected = Decimal(0)
    for chunk in LearnerChunk.objects.filter(learner__run=placed_run).select_related("cluster"):
        price = chunk.cluster.prices.get().unit_price
        assert chunk.accelerators == 2  # 4 accelerators, 2 learner slots
        expected += chunk.accelerator_seconds / Decimal(3600) * chunk.accelerators * price
    ledger = UsageRecord.objects.filter(subject_id=str(placed_run.pk)).aggregate(t=Sum("amount"))["t"]
    assert LearnerChunk.objects.filter(learner__run=placed_run).count() == 6
    assert ledger is not None and ledger > 0
    cent = Decimal("0.01")
    assert ledger.quantize(cent, ROUND_HALF_EVEN) == expected.quantize(cent, ROUND_HALF_EVEN)
    # And to the nano-unit: each row is seconds × accelerators × price, rounded once.
    assert abs(ledger - expected) < Decimal("0.00000001") * 6


def test_syncer_ticks_record_each_version_once_even_when_repeated(placed_run: TrainingRun) -> None:
    learner = TrainingLearner.objects.get(run=placed_run, index=0)
    for seq in range(2):
        orchestrator.learner_chunk_execute(
            learner_id=learner.pk, generation=0, seq=seq, worker_hostname="w@1"
        )
    token = placed_run.syncer_token
    orchestrator.syncer_tick_execute(run_id=placed_run.pk, token=token)
    # A second syncer that never saw the first (a fresh process) resumes from the store.
    orchestrator._SYNCERS.clear()
    orchestrator.syncer_tick_execute(run_id=placed_run.pk, token=token)
    orchestrator.syncer_tick_execute(run_id=placed_run.pk, token="not-the-current-chain")
    versions = list(GlobalVersionRecord.objects.filter(run=placed_run).values_list("fragment", "version"))
    assert len(versions) == len(set(versions))
    assert (0, 0) in versions and (0, 1) in versions
    v1 = GlobalVersionRecord.objects.get(run=placed_run, fragment=0, version=1)
    assert v1.learners_merged == [0] and v1.tokens_merged > 0 and v1.eval_loss is not None


def test_progress_reports_cost_per_million_tokens_and_per_unit_of_loss(placed_run: TrainingRun) -> None:
    from training.selectors import run_progress

    for learner in TrainingLearner.objects.filter(run=placed_run):
        orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@1")
    orchestrator.syncer_tick_execute(run_id=placed_run.pk, token=placed_run.syncer_token)
    placed_run.refresh_from_db()
    progress = run_progress(run=placed_run)
    ledger = UsageRecord.objects.filter(subject_id=str(placed_run.pk)).aggregate(t=Sum("amount"))["t"]
    assert progress.cost == ledger
    assert progress.tokens == sum(
        TrainingLearner.objects.filter(run=placed_run).values_list("tokens", flat=True)
    )
    assert progress.cost_per_million_tokens == (ledger * 1_000_000 / progress.tokens).quantize(
        Decimal("0.000001")
    )
    assert progress.eval_loss is not None and progress.initial_eval_loss is not None
    if progress.eval_loss < progress.initial_eval_loss:
        assert progress.cost_per_loss_improvement is not None and progress.cost_per_loss_improvement > 0
