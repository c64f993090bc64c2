"""Learner chunks in-process: claims are idempotent, each chunk is billed once at its cluster's price,
and the syncer records every published version once. (Real workers: tests/integration.)"""

from __future__ import annotations

import hashlib
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import pytest
import torch
from django.db.models import Sum
from django.utils import timezone

from billing.models import UsageRecord
from registry.models import Cluster
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
        assert chunk.accelerators == 1  # one rank: the devices it used, not its slot's 2
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
    services.versions_evaluate(run_id=placed_run.pk)  # the evaluator, on a cluster's queue in a worker
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
    services.versions_evaluate(run_id=placed_run.pk)  # the evaluator, on a cluster's queue in a worker
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


# --- learner state across processes -----------------------------------------------------------


def _state(learner: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    meta, tensors = learner.state_dict()
    return meta, {k: t.clone() for k, t in tensors.items()}


def _checkpoints(run: TrainingRun) -> Any:
    from training.run_engines import run_checkpoints

    return run_checkpoints(run)


@pytest.fixture
def placed_4bit_run(db: Any, tmp_path: Path) -> TrainingRun:
    _healthy("1.250000")
    _healthy("3.000000")
    # Chunks of 2 s: long enough to push, fetch a version and push again on a loaded machine.
    config = _config(compression={"kind": "4bit"}, chunk_seconds=2.0)
    run = services.training_run_create(config=config, created_by=None, name="chunks-4bit")
    services.training_run_place(run_id=run.pk)
    run.refresh_from_db()
    assert run.state == TrainingRun.State.RUNNING, run.reason
    return run


def _chunks_until_pushed(run: TrainingRun, learner: TrainingLearner) -> int:
    """Run learner chunks in this process until one pushed a delta; returns the next chunk's seq."""
    from training.run_engines import run_transport

    seq = 0
    while not run_transport(run).delta_ids(0, learner=learner.index):
        assert seq < 10, "no delta pushed"
        orchestrator.learner_chunk_execute(
            learner_id=learner.pk, generation=0, seq=seq, worker_hostname="w@1"
        )
        seq += 1
    return seq


def test_a_chunk_in_another_process_continues_from_the_checkpoint_with_its_adamw_state(
    placed_4bit_run: TrainingRun,
) -> None:
    run = placed_4bit_run
    learner = TrainingLearner.objects.get(run=run, index=0)
    seq = _chunks_until_pushed(run, learner)
    meta, tensors = _state(orchestrator._LEARNERS[(orchestrator.run_key(run), 0)].learner)
    assert any(k.startswith("opt:exp_avg:") for k in tensors)

    orchestrator._LEARNERS.clear()  # the next chunk lands on another worker process
    learner.refresh_from_db()
    start = orchestrator._learner_for(run, 0, 0, seq, learner.steps, learner.cluster)
    assert start.source == "checkpoint"
    assert start.checkpoint_key == f"runs/{run.pk}/learners/l0000/g000000-c{seq - 1:08d}.syd"
    restored_meta, restored = _state(start.slot.learner)
    assert restored_meta == meta and restored_meta["step_count"] == learner.steps
    assert restored.keys() == tensors.keys()
    for key, t in tensors.items():  # parameters, AdamW moments and steps, sampler, held copy
        assert torch.equal(restored[key], t), key

    orchestrator._LEARNERS.clear()
    orchestrator.syncer_tick_execute(run_id=run.pk, token=run.syncer_token)  # version 1 comes down
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=seq, worker_hostname="w@2")
    chunks = list(LearnerChunk.objects.filter(learner=learner).order_by("seq"))
    first, last = chunks[0], chunks[-1]
    assert first.state_source == "rejoin" and last.state_source == "checkpoint"
    assert all(c.state_source == "memory" for c in chunks[1:-1])
    assert last.checkpoint_key == start.checkpoint_key and not last.error
    # Measured, not computed: the rejoin read every fragment's version 0 whole (the syncer's
    # full state, header and all), as the store holds it.
    from training.run_engines import run_transport  # imports torch, as the other tests here do

    store = run_transport(run).store
    version0 = [k for k in store.list(f"runs/{run.pk}/versions/") if k.endswith("/v00000000.syd")]
    full = sum(store.local_path(k).stat().st_size for k in version0)
    params = 4 * sum(t.numel() for k, t in tensors.items() if k.startswith("param:"))
    assert version0 and first.bytes_received == full > params
    # Then version 1 came down as each fragment's 4-bit down-delta, read whole.
    down1 = [k for k in store.list(f"runs/{run.pk}/down/") if k.endswith("/v00000001.syd")]
    assert down1 and last.bytes_received == sum(store.local_path(k).stat().st_size for k in down1)
    assert last.bytes_received < full / 4
    assert _checkpoints(run).list(0) == [(0, c.seq) for c in chunks][-2:]  # older ones pruned


class _Killed(BaseException):
    """The worker process dies (SIGKILL) before the chunk is recorded as finished."""


def test_a_chunk_run_again_after_a_crash_starts_from_the_checkpoint_before_it_and_counts_nothing_twice(
    placed_4bit_run: TrainingRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    from training.run_engines import run_transport

    run = placed_4bit_run
    learner = TrainingLearner.objects.get(run=run, index=0)
    transport = run_transport(run)
    seq = _chunks_until_pushed(run, learner)
    orchestrator.syncer_tick_execute(run_id=run.pk, token=run.syncer_token)
    before = set(transport.delta_ids(0, learner=0))

    real_finish = services.learner_chunk_finish

    def killed(**kwargs: Any) -> None:
        raise _Killed

    monkeypatch.setattr(services, "learner_chunk_finish", killed)
    with pytest.raises(_Killed):
        orchestrator.learner_chunk_execute(
            learner_id=learner.pk, generation=0, seq=seq, worker_hostname="w@1"
        )
    monkeypatch.setattr(services, "learner_chunk_finish", real_finish)
    first_attempt = sorted(set(transport.delta_ids(0, learner=0)) - before)
    assert first_attempt, "the first attempt pushed before it died"
    assert (0, seq) in _checkpoints(run).list(0)  # it got as far as writing its checkpoint
    orchestrator.syncer_tick_execute(run_id=run.pk, token=run.syncer_token)  # and its push was merged

    orchestrator._LEARNERS.clear()  # the process is gone; the broker redelivers the chunk
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=seq, worker_hostname="w@2")
    chunk = LearnerChunk.objects.get(learner=learner, seq=seq)
    assert chunk.finished_at is not None and not chunk.error and chunk.worker_hostname == "w@2"
    # Restored from the previous chunk's checkpoint, not from the one the dead attempt left.
    assert chunk.checkpoint_key.endswith(f"g000000-c{seq - 1:08d}.syd")
    rerun = sorted(set(transport.delta_ids(0, learner=0)) - before - set(first_attempt))
    seq_of = lambda delta_id: int(delta_id.rsplit("-s", 1)[1])  # noqa: E731
    assert rerun and min(map(seq_of, rerun)) > max(map(seq_of, first_attempt))  # numbered after them
    # The database counts every finished chunk once, and so does the lr schedule.
    learner.refresh_from_db()
    finished = LearnerChunk.objects.filter(learner=learner)
    assert learner.steps == sum(c.steps for c in finished)
    meta, _ = _checkpoints(run).read(0, 0, seq)
    assert meta["learner"]["step_count"] == learner.steps
    # The re-run's deltas carry its own steps only: the steps pending in the previous chunk's
    # checkpoint went up with the dead attempt's push and are not sent again.
    pushed = sum(transport.get_delta(0, d).steps for d in rerun)
    assert pushed + meta["learner"]["pending_steps"][0] == chunk.steps


@pytest.mark.parametrize("then", ["run-again", "re-placed"])
def test_the_windows_a_dead_chunk_pushed_are_not_trained_again(
    placed_4bit_run: TrainingRun, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    """A chunk pushes, then dies before its checkpoint. Its learner, run again (the broker
    redelivers the chunk) or re-placed (a new generation), restores the previous checkpoint:
    the windows the dead chunk trained up to its newest push are in the global model through
    that push, so they are skipped, and training goes on from the first window it had not
    pushed (issue 31: exactly-once tokens)."""
    from training.engine.learner import Learner

    run = placed_4bit_run
    learner = TrainingLearner.objects.get(run=run, index=0)
    seq = _chunks_until_pushed(run, learner)
    orchestrator.syncer_tick_execute(run_id=run.pk, token=run.syncer_token)  # so it may push again

    drawn: list[str] = []  # the windows trained, in order (a digest of each batch)
    pushed_after: list[int] = []  # how many windows were trained when each delta was made
    real_step, real_delta = Learner.train_step, Learner.make_delta

    def recording_step(self: Learner) -> float:
        real_next = self.sampler.next

        def recording_next() -> Any:
            x, y = real_next()
            drawn.append(hashlib.sha256(x.cpu().numpy().tobytes()).hexdigest())
            return x, y

        self.sampler.next = recording_next
        try:
            return real_step(self)
        finally:
            del self.sampler.next

    def recording_delta(self: Learner, fragment: int, **kwargs: Any) -> Any:
        pushed_after.append(len(drawn))
        return real_delta(self, fragment, **kwargs)

    monkeypatch.setattr(Learner, "train_step", recording_step)
    monkeypatch.setattr(Learner, "make_delta", recording_delta)
    checkpoints = type(_checkpoints(run))
    real_write = checkpoints.write

    def killed(*args: Any, **kwargs: Any) -> None:
        raise _Killed

    monkeypatch.setattr(checkpoints, "write", killed)
    with pytest.raises(_Killed):
        orchestrator.learner_chunk_execute(
            learner_id=learner.pk, generation=0, seq=seq, worker_hostname="w@1"
        )
    monkeypatch.setattr(checkpoints, "write", real_write)
    assert pushed_after, "the dead chunk pushed before it died"
    dead, pushed = list(drawn), max(pushed_after)
    assert (0, seq) not in _checkpoints(run).list(0)  # it died before its checkpoint
    orchestrator.syncer_tick_execute(run_id=run.pk, token=run.syncer_token)  # its pushes merged

    orchestrator._LEARNERS.clear()  # the process is gone
    drawn.clear()
    generation, next_seq = 0, seq
    if then == "re-placed":
        services.learner_failover(learner_id=learner.pk, reason="worker lost", now=timezone.now())
        learner.refresh_from_db()
        generation, next_seq = learner.generation, 0
        assert generation == 1, learner.last_error
    orchestrator.learner_chunk_execute(
        learner_id=learner.pk, generation=generation, seq=next_seq, worker_hostname="w@2"
    )
    chunk = LearnerChunk.objects.get(learner=learner, generation=generation, seq=next_seq)
    assert chunk.finished_at is not None and not chunk.error
    assert chunk.checkpoint_key.endswith(f"g000000-c{seq - 1:08d}.syd")  # restored from before it
    assert drawn, "the learner trained after the restore"
    assert not set(dead[:pushed]) & set(drawn)  # no pushed window is trained again
    if len(dead) > pushed:  # windows trained but never pushed come next, in order
        assert drawn[: len(dead) - pushed] == dead[pushed:][: len(drawn)]
