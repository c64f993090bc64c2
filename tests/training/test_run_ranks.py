"""A run whose learners are process groups (learners.ranks = 2): a chunk runs through the normal
chunk path on 2 gloo ranks, bills the 2 devices it used, and a rank that fails fails the chunk.
The learner's next chunk in the same process keeps the group (the same helper, no start-up), and
the group ends with the run, after a failed chunk, or when the learner moves."""

from __future__ import annotations

import os
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from billing.models import UsageRecord
from registry.models import Cluster
from tests.factories import make_cluster, tiny_run_config
from training import orchestrator, run_ranks, services
from training.engine.distributed import group_release, kept_group
from training.models import LearnerChunk, TrainingLearner, TrainingRun
from training.run_engines import run_checkpoints
from training.run_selectors import run_rank_starts


def _healthy(price: str) -> Cluster:
    # 4 accelerators, 2 learner slots: a learner slot holds the 2 devices its 2 ranks need.
    cluster = make_cluster(price=Decimal(price), accelerator_count=4, capacity=2)
    Cluster.objects.filter(pk=cluster.pk).update(status="healthy", last_heartbeat_at=timezone.now())
    return cluster


@pytest.fixture(autouse=True)
def _no_kept_group() -> Any:
    yield
    group_release()  # each test starts its groups afresh


@pytest.fixture
def ranked_run(db: Any, tmp_path: Path) -> TrainingRun:
    _healthy("1.250000")
    _healthy("3.000000")
    config = tiny_run_config(learners={"count": 2, "quorum": 1, "batch_size": 4, "ranks": 2})
    run = services.training_run_create(config=config, created_by=None, name="ranks")
    services.training_run_place(run_id=run.pk)
    run.refresh_from_db()
    assert run.state == TrainingRun.State.RUNNING, run.reason
    return run


def test_a_chunk_of_a_two_rank_learner_trains_checkpoints_both_ranks_and_bills_two_devices(
    ranked_run: TrainingRun,
) -> None:
    learner = TrainingLearner.objects.get(run=ranked_run, index=0)
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@1")
    chunk = LearnerChunk.objects.get(learner=learner)
    assert chunk.error == "" and chunk.finished_at is not None and chunk.steps >= 1
    assert chunk.tokens == chunk.steps * 4 * 16  # the learner's whole batch: 2 windows on each rank
    assert all(0 < loss < 10 for loss in chunk.train_losses)
    assert chunk.accelerators == 2  # its 2 ranks, one device each
    record = UsageRecord.objects.get(idempotency_key=chunk.billing_key)
    assert record.quantity == (chunk.accelerator_seconds / Decimal(3600) * 2).quantize(Decimal("1e-9"))
    assert f"{chunk.accelerator_seconds}s × 2 on" in record.description
    meta, tensors = run_checkpoints(ranked_run).read(0, 0, 0)
    assert "sampler" in tensors and "sampler@1" in tensors  # rank 0's and rank 1's positions
    assert meta["learner"]["step_count"] == chunk.steps
    slot = orchestrator._LEARNERS[(orchestrator.run_key(ranked_run), 0)]
    assert slot.learner.group is None and set(slot.learner.rank_samplers) == {1}


def test_a_rank_that_fails_fails_the_chunk_and_the_chunk_bills_its_time(
    ranked_run: TrainingRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = run_ranks.sampler_spec

    def broken(*args: Any, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        meta, _ = real(*args, **kwargs)
        return meta, {}  # rank 1 is sent no data: it raises as it starts

    monkeypatch.setattr(run_ranks, "sampler_spec", broken)
    learner = TrainingLearner.objects.get(run=ranked_run, index=0)
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@1")
    chunk = LearnerChunk.objects.get(learner=learner)
    assert chunk.error.startswith("RankError: rank 1 exited with 1") and chunk.steps == 0
    assert chunk.billed and chunk.accelerators == 2
    learner.refresh_from_db()
    assert learner.state == TrainingLearner.State.LOST  # the supervisor re-places it; the chunk is redone
    assert (orchestrator.run_key(ranked_run), 0) not in orchestrator._LEARNERS
    assert not run_checkpoints(ranked_run).list(0)


def test_a_chunk_trains_for_chunk_seconds_after_its_ranks_have_started(
    ranked_run: TrainingRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """chunk_seconds is seconds of inner steps: a rank start slower than a whole chunk (a loaded
    machine importing torch in the helper) must not leave the chunk one step long."""
    real = orchestrator.learner_ranks_start
    chunk_seconds = ranked_run.config["chunk_seconds"]

    def slow(**kwargs: Any) -> Any:
        time.sleep(chunk_seconds + 0.5)
        return real(**kwargs)

    monkeypatch.setattr(orchestrator, "learner_ranks_start", slow)
    learner = TrainingLearner.objects.get(run=ranked_run, index=0)
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@1")
    chunk = LearnerChunk.objects.get(learner=learner)
    assert chunk.error == "" and chunk.steps > 1
    # Billing still counts the whole chunk, rank start included.
    assert chunk.accelerator_seconds > Decimal(str(chunk_seconds + 0.5))


def _chunk(learner: TrainingLearner, seq: int, generation: int = 0) -> LearnerChunk:
    orchestrator.learner_chunk_execute(
        learner_id=learner.pk, generation=generation, seq=seq, worker_hostname="w@1"
    )
    return LearnerChunk.objects.get(learner=learner, generation=generation, seq=seq)


def _helper() -> int:
    kept = kept_group()
    assert kept is not None
    return kept.pids[0]


def test_the_next_chunk_of_a_learner_keeps_its_rank_group_and_the_run_s_end_releases_it(
    ranked_run: TrainingRun,
) -> None:
    learner = TrainingLearner.objects.get(run=ranked_run, index=0)
    first = _chunk(learner, 0)
    assert first.error == "" and first.ranks_start == LearnerChunk.RankStart.STARTED
    assert first.ranks_start_seconds is not None and first.ranks_start_seconds > 0
    helper = _helper()
    second = _chunk(learner, 1)
    assert second.error == "" and second.steps >= 1
    assert second.ranks_start == LearnerChunk.RankStart.KEPT and _helper() == helper
    # Nothing of the learner's state was lost on the way: both ranks' positions checkpointed,
    # the step count goes on.
    meta, tensors = run_checkpoints(ranked_run).read(0, 0, 1)
    assert meta["learner"]["step_count"] == first.steps + second.steps and "sampler@1" in tensors
    # The run's page says how its chunks got their ranks.
    starts = run_rank_starts(run=ranked_run)
    assert starts is not None and (starts.started, starts.kept) == (1, 1)
    assert starts.started_seconds == pytest.approx(first.ranks_start_seconds)
    client = Client()
    client.force_login(User.objects.create_superuser("ranks-admin", password="x"))  # noqa: S106
    page = client.get(f"/training/{ranked_run.pk}/").content.decode()
    assert (
        "started for <strong>1</strong> chunk (" in page
        and "previous chunk on its worker for <strong>1</strong>" in page
    )
    # The run ends in this process: its group ends with it, and its helper has left.
    orchestrator.forget_run(ranked_run)
    assert kept_group() is None
    with pytest.raises(ProcessLookupError):
        os.kill(helper, 0)


def test_a_failed_chunk_ends_the_group_it_kept_and_the_next_chunk_starts_ranks_afresh(
    ranked_run: TrainingRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    learner = TrainingLearner.objects.get(run=ranked_run, index=0)
    _chunk(learner, 0)
    helper = _helper()

    def full_disk(*args: Any, **kwargs: Any) -> None:
        raise OSError("no space left on device")

    monkeypatch.setattr(type(run_checkpoints(ranked_run)), "write", full_disk)
    failed = _chunk(learner, 1)
    assert failed.error == "OSError: no space left on device"
    assert failed.ranks_start == LearnerChunk.RankStart.KEPT  # it trained on the kept group...
    assert kept_group() is None  # ...which is not kept after the failure
    with pytest.raises(ProcessLookupError):
        os.kill(helper, 0)


def test_a_sharded_learner_trains_pushes_and_checkpoints_whole_through_the_chunk_path(
    db: Any, tmp_path: Path
) -> None:
    _healthy("1.250000")
    learners = {"count": 1, "quorum": 1, "batch_size": 4, "ranks": 2, "sharding": "fsdp"}
    config = tiny_run_config(learners=learners, h=2, chunk_seconds=2.0)
    run = services.training_run_create(config=config, created_by=None, name="fsdp")
    services.training_run_place(run_id=run.pk)
    run.refresh_from_db()
    learner = TrainingLearner.objects.get(run=run, index=0)
    first = _chunk(learner, 0)
    # The syncer merges the Δ the chunk gathered from the two ranks' shards (h = 2: it pushed
    # after 2 steps) and publishes version 1; the next chunk adopts it into both ranks' shards
    # and pushes again.
    orchestrator.syncer_tick_execute(run_id=run.pk, token=run.syncer_token)
    second = _chunk(learner, 1)
    assert first.error == second.error == "" and second.ranks_start == LearnerChunk.RankStart.KEPT
    assert first.steps >= 2 and first.bytes_sent > 0
    assert second.bytes_received > 0 and second.bytes_sent > 0
    assert first.tokens == first.steps * 4 * 16
    # The checkpoint is the learner whole again, on the host: both ranks' stream positions, the
    # step count of both chunks, parameters of the model's full shapes.
    meta, tensors = run_checkpoints(run).read(0, 0, 1)
    assert meta["learner"]["step_count"] == first.steps + second.steps and "sampler@1" in tensors
    assert tensors["param:wte.weight"].shape == (256, 16)
    slot = orchestrator._LEARNERS[(orchestrator.run_key(run), 0)]
    assert slot.learner.sharded is None and slot.learner.device.type == "cpu"
    assert slot.learner.base_version == [1]
    assert kept_group() is not None and kept_group().group.sharded  # type: ignore[union-attr]
