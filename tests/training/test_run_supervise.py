"""The supervisor in-process: lost learners fail over, quorum rules, a silent syncer restarts;
a spent money budget stops the run with its checkpoint kept."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from billing.models import UsageRecord
from registry.models import Cluster, FailoverEvent
from tests.factories import make_cluster, tiny_run_config
from training import orchestrator, services
from training.models import LearnerChunk, PlacementDecision, TrainingLearner, TrainingRun

_config = tiny_run_config


def _cluster(price: str, *, capacity: int = 1, status: str = "healthy") -> Cluster:
    cluster = make_cluster(price=Decimal(price), accelerator_count=capacity, capacity=capacity)
    Cluster.objects.filter(pk=cluster.pk).update(status=status, last_heartbeat_at=timezone.now())
    cluster.refresh_from_db()
    return cluster


def _start(store: Path, **over: Any) -> TrainingRun:
    run = services.training_run_create(config=_config(**over), created_by=None, name="sup")
    services.training_run_place(run_id=run.pk)
    run.refresh_from_db()
    return run


@pytest.mark.django_db
def test_a_learner_on_a_down_cluster_moves_to_the_cheapest_healthy_cluster(tmp_path: Path) -> None:
    a, b = _cluster("1.0"), _cluster("2.0")
    spare_dear, spare_cheap = _cluster("9.0"), _cluster("4.0")
    run = _start(tmp_path)
    learner = TrainingLearner.objects.get(run=run, index=0)
    assert learner.cluster_id == a.pk
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@a")
    Cluster.objects.filter(pk=a.pk).update(status="down")

    counts = services.training_runs_supervise()
    assert counts["failovers"] == 1
    learner.refresh_from_db()
    assert (learner.generation, learner.cluster_id, learner.state) == (1, spare_cheap.pk, "placed")
    decision = PlacementDecision.objects.get(run=run, learner_index=0, generation=1)
    assert decision.reason == "failover" and decision.unit_price == Decimal("4")
    rejected = {c["cluster"]: c["rejected"] for c in decision.candidates}
    assert rejected[a.slug] == "status down" and rejected[b.slug] == "no free capacity"
    event = FailoverEvent.objects.get(training_run_id=run.pk)
    assert event.kind == "training" and event.subject == f"training-run:{run.pk}/learner:0"
    assert event.code == "heartbeat_timeout"  # its cluster went down: no worker heartbeat
    assert event.from_cluster_id == a.pk and event.to_cluster_id == spare_cheap.pk
    assert event.recovered_at is None and event.tokens_lost is not None
    run.refresh_from_db()
    assert run.state == TrainingRun.State.RECOVERING
    # Supervising again changes nothing: one event per loss.
    services.training_runs_supervise()
    assert FailoverEvent.objects.filter(training_run_id=run.pk).count() == 1

    # The new generation's first chunk closes the event and the run is running again.
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=1, seq=0, worker_hostname="w@spare")
    event.refresh_from_db()
    assert event.recovered_at is not None
    services.training_runs_supervise()
    run.refresh_from_db()
    assert run.state == TrainingRun.State.RUNNING
    assert spare_dear.pk not in set(LearnerChunk.objects.values_list("cluster_id", flat=True))


@pytest.mark.django_db
def test_with_no_room_the_learner_stays_lost_until_its_cluster_comes_back(tmp_path: Path) -> None:
    a, b = _cluster("1.0"), _cluster("2.0")
    run = _start(tmp_path)
    Cluster.objects.filter(pk=a.pk).update(status="down")
    services.training_runs_supervise()
    learner = TrainingLearner.objects.get(run=run, index=0)
    assert learner.state == "lost" and learner.generation == 0
    event = FailoverEvent.objects.get(training_run_id=run.pk)
    assert event.to_cluster is None and "not re-placed yet" in event.reason
    run.refresh_from_db()
    assert run.state == TrainingRun.State.RECOVERING  # one of two learners alive, quorum 1 holds

    Cluster.objects.filter(pk=a.pk).update(status="healthy")
    services.training_runs_supervise()
    learner.refresh_from_db()
    assert (learner.state, learner.generation, learner.cluster_id) == ("placed", 1, a.pk)
    assert FailoverEvent.objects.filter(training_run_id=run.pk).count() == 1
    assert b.pk in set(TrainingLearner.objects.filter(run=run).values_list("cluster_id", flat=True))


@pytest.mark.django_db
def test_a_silent_learner_is_lost_after_its_timeout(tmp_path: Path) -> None:
    _cluster("1.0"), _cluster("2.0")
    run = _start(tmp_path)
    later = timezone.now() + timedelta(seconds=30)
    counts = services.training_runs_supervise(now=later)
    assert counts["failovers"] == 2
    reasons = set(FailoverEvent.objects.filter(training_run_id=run.pk).values_list("reason", flat=True))
    assert all("no report for" in r for r in reasons)
    codes = set(FailoverEvent.objects.filter(training_run_id=run.pk).values_list("code", flat=True))
    assert codes == {"worker_lost"}


@pytest.mark.django_db
def test_a_silent_syncer_chain_is_replaced(tmp_path: Path) -> None:
    _cluster("1.0"), _cluster("2.0")
    run = _start(tmp_path)
    old = run.syncer_token
    counts = services.training_runs_supervise(now=timezone.now() + timedelta(seconds=60))
    run.refresh_from_db()
    assert counts["syncers_restarted"] == 1 and run.syncer_token != old
    # The old chain's ticks are no-ops from now on.
    assert services.syncer_tick_claim(run_id=run.pk, token=old) is None
    assert services.syncer_tick_claim(run_id=run.pk, token=run.syncer_token) is not None


@pytest.mark.django_db
def test_no_cluster_at_all_fails_the_run_naming_each_rejected_cluster(tmp_path: Path) -> None:
    down = _cluster("1.0", status="down")
    run = _start(tmp_path)
    assert run.state == TrainingRun.State.FAILED
    assert f"{down.slug}: status down" in run.reason
    assert not TrainingLearner.objects.filter(run=run).exists()


@pytest.mark.django_db
def test_a_spent_money_budget_stops_the_run_and_keeps_a_checkpoint(tmp_path: Path) -> None:
    _cluster("3600.0"), _cluster("3600.0")  # a dollar per accelerator-second
    run = _start(tmp_path, money_budget="0.10")
    learner = TrainingLearner.objects.get(run=run, index=0)
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@1")
    billed = UsageRecord.objects.filter(subject_id=str(run.pk)).count()
    assert billed == 1
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=1, worker_hostname="w@1")
    run.refresh_from_db()
    assert run.state == TrainingRun.State.BUDGET_EXHAUSTED
    assert "money budget 0.100000000 USD spent" in run.reason
    assert run.artifact_uri.startswith(f"file://{tmp_path}/runs/{run.pk}/artifacts/checkpoint-")
    assert not LearnerChunk.objects.filter(learner=learner, seq=1).exists()
    assert UsageRecord.objects.filter(subject_id=str(run.pk)).count() == billed


@pytest.mark.django_db
def test_a_money_budget_is_checked_as_the_chunk_trains_not_at_its_end(tmp_path: Path) -> None:
    """A run with a 2.00 budget at a dollar per accelerator-second and 60-second chunks: at its
    chunk's end the run would have spent about 60; checked every step it stops near 2, with a
    checkpoint, and ends budget_exhausted."""
    from training import selectors

    _cluster("3600.0"), _cluster("3600.0")
    run = _start(tmp_path, money_budget="2.00", chunk_seconds=60, learner_timeout=150)
    learner = TrainingLearner.objects.get(run=run, index=0)
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@1")
    chunk = LearnerChunk.objects.get(learner=learner, seq=0)
    assert chunk.stopped_by == services.BUDGET_REACHED and chunk.steps >= 1
    assert chunk.finished_at is not None and chunk.billed
    assert (0, 0) in orchestrator.run_checkpoints(run).list(0)  # stopped as a chunk ends
    run.refresh_from_db()
    assert run.state == TrainingRun.State.BUDGET_EXHAUSTED
    assert "money budget 2.000000000 USD spent" in run.reason
    spent = selectors.run_spend(run_id=run.pk)
    # Billed from the claim to the chunk's end: the budget, plus the last step and the
    # checkpoint write; nowhere near the 60 the whole chunk would have cost.
    assert Decimal("1.99") <= spent < Decimal("20")
    assert not LearnerChunk.objects.filter(learner=learner, seq=1).exists()


@pytest.mark.django_db
def test_a_learner_that_fails_on_every_cluster_fails_the_run_instead_of_moving_forever(
    tmp_path: Path,
) -> None:
    import shutil

    _cluster("1.0", capacity=2), _cluster("2.0", capacity=2)
    run = _start(tmp_path)
    shutil.rmtree(tmp_path / "runs")  # the global versions are gone: every chunk raises
    orchestrator._LEARNERS.clear()
    learner = TrainingLearner.objects.get(run=run, index=0)
    for attempt in range(3):
        learner.refresh_from_db()
        orchestrator.learner_chunk_execute(
            learner_id=learner.pk, generation=learner.generation, seq=0, worker_hostname=f"w@{attempt}"
        )
        services.training_runs_supervise()
    run.refresh_from_db()
    assert run.state == TrainingRun.State.FAILED
    assert "learner 0 failed 3 chunks; last: LookupError" in run.reason
    errors = LearnerChunk.objects.filter(learner=learner).exclude(error="").count()
    assert errors == 3
    # One loss episode, one event: it stays open because the learner never trained again.
    event = FailoverEvent.objects.get(training_run_id=run.pk)
    assert event.recovered_at is None and "chunk 0 failed: LookupError" in event.reason
    assert event.code == "chunk_failed"
    assert PlacementDecision.objects.filter(run=run, learner_index=0, reason="failover").count() == 2


@pytest.mark.django_db
def test_a_killed_chunk_is_billed_to_its_workers_last_heartbeat_and_its_unpushed_work_counts_as_lost(
    tmp_path: Path,
) -> None:
    from registry.models import WorkerHeartbeat

    a, _ = _cluster("1.0"), _cluster("2.0")
    _cluster("4.0")
    run = _start(tmp_path)
    learner = TrainingLearner.objects.get(run=run, index=0)
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@a")
    now = timezone.now()
    # Chunk 1 was training when its worker was SIGKILLed: it last pushed 8 s after it started,
    # the worker's last heartbeat came 6 s after that.
    LearnerChunk.objects.create(
        learner=learner,
        generation=0,
        seq=1,
        cluster=a,
        worker_hostname="w@a",
        started_at=now - timedelta(seconds=20),
        progress_at=now - timedelta(seconds=12),
    )
    WorkerHeartbeat.objects.create(
        cluster=a,
        hostname="w@a",
        started_at=now - timedelta(minutes=5),
        last_seen_at=now - timedelta(seconds=6),
    )
    Cluster.objects.filter(pk=a.pk).update(status="down")
    services.training_runs_supervise(now=now)

    killed = LearnerChunk.objects.get(learner=learner, seq=1)
    assert killed.finished_at == now - timedelta(seconds=6)
    assert killed.accelerator_seconds == Decimal("14.000") and killed.billed
    assert killed.error.startswith("lost: cluster")
    record = UsageRecord.objects.get(idempotency_key=killed.billing_key)
    assert record.quantity == (Decimal("14.000") / 3600).quantize(Decimal("0.000000001"))
    event = FailoverEvent.objects.get(training_run_id=run.pk)
    assert event.tokens_lost is not None and event.tokens_lost > 0
    assert event.extra_cost > 0
