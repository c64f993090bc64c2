"""Version evaluation off the control queue (training.services.evaluation): the syncer records a
version at once, and one evaluator per run, sent to a cluster's queue, fills in its eval loss;
where it goes when clusters are down; what the store keeps for it; a version it cannot read."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from registry.models import Cluster
from registry.queues import CONTROL_QUEUE, cluster_queue
from tests.factories import make_cluster, tiny_run_config
from training import dispatch, orchestrator, services
from training.models import GlobalVersionRecord, TrainingLearner, TrainingRun
from training.run_config import RunConfigError, run_config_validate
from training.run_engines import run_engine, run_transport, version_params


def _cluster(price: str, **fields: Any) -> Cluster:
    cluster = make_cluster(price=Decimal(price), capacity=2, **fields)
    Cluster.objects.filter(pk=cluster.pk).update(status="healthy", last_heartbeat_at=timezone.now())
    cluster.refresh_from_db()
    return cluster


def _down(cluster: Cluster) -> None:
    Cluster.objects.filter(pk=cluster.pk).update(status="down")


@pytest.fixture
def sent(monkeypatch: Any) -> list[tuple[str, tuple[Any, ...], str]]:
    """The tasks training.dispatch sends, as (name, args, queue), instead of a broker."""
    calls: list[tuple[str, tuple[Any, ...], str]] = []

    def record(name: str, *args: Any, queue: str, countdown: float | None = None) -> None:
        calls.append((name, args, queue))

    monkeypatch.setattr(dispatch, "task_send", record)
    return calls


def _place(**config: Any) -> TrainingRun:
    run = services.training_run_create(config=tiny_run_config(**config), created_by=None, name="evals")
    services.training_run_place(run_id=run.pk)
    run.refresh_from_db()
    assert run.state == TrainingRun.State.RUNNING, run.reason
    return run


def _running(**config: Any) -> TrainingRun:
    """A run placed on two healthy clusters (the learners' own: the evaluator goes to one)."""
    _cluster("1.000000")
    _cluster("2.000000")
    return _place(**config)


def _train_and_tick(run: TrainingRun, chunks: int, capture: Any) -> None:
    learner = TrainingLearner.objects.get(run=run, index=0)
    done = learner.chunks.count()
    for seq in range(done, done + chunks):
        orchestrator.learner_chunk_execute(
            learner_id=learner.pk, generation=0, seq=seq, worker_hostname="w@1"
        )
        with capture(execute=True):
            orchestrator.syncer_tick_execute(run_id=run.pk, token=run.syncer_token)


def _evaluations(sent: list[tuple[str, tuple[Any, ...], str]]) -> list[tuple[tuple[Any, ...], str]]:
    return [(args, queue) for name, args, queue in sent if name == dispatch.VERSIONS_EVALUATE]


def _work_through(sent: list[Any], capture: Any) -> int:
    """Run the evaluator tasks as a cluster worker would: each sent one, until none is sent."""
    seen, done = 0, 0
    while len(_evaluations(sent)) > seen:
        (run_id, token), _ = _evaluations(sent)[seen]
        seen += 1
        with capture(execute=True):
            done += services.versions_evaluate(run_id=run_id, token=token, limit=1)
    return done


def test_versions_are_recorded_at_once_and_evaluated_on_the_eval_clusters_queue(
    db: Any, tmp_path: Path, sent: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    _cluster("1.000000")
    _cluster("2.000000")
    evaluator = _cluster("9.000000", accelerator_type="H100")
    run = _place(placement={"eval_cluster": evaluator.slug})
    _train_and_tick(run, 2, django_capture_on_commit_callbacks)
    records = GlobalVersionRecord.objects.filter(run=run, version__gt=0)
    assert records.exists() and all(r.eval_loss is None for r in records)
    # One evaluator for the run, on the named cluster's queue, however many ticks ran.
    run.refresh_from_db()
    assert _evaluations(sent) == [((run.pk, run.evaluator_token), cluster_queue(evaluator.slug))]
    assert run.evaluator_until is not None and run.evaluator_queue == evaluator.slug
    # Each task evaluates one version and sends the next; version 0 was scored at placement.
    assert _work_through(sent, django_capture_on_commit_callbacks) == records.count()
    assert len(_evaluations(sent)) == records.count()
    engine, transport = run_engine(run), run_transport(run)
    for record in GlobalVersionRecord.objects.filter(run=run):
        params = version_params(transport, engine.fragments, [record.version])
        assert record.eval_loss == pytest.approx(engine.evaluate(params))
    run.refresh_from_db()
    assert run.evaluator_until is None and run.evaluator_token == ""
    assert services.versions_evaluate(run_id=run.pk) == 0  # nothing evaluated twice
    # Nothing waits: the next tick sends none.
    with django_capture_on_commit_callbacks(execute=True):
        orchestrator.syncer_tick_execute(run_id=run.pk, token=run.syncer_token)
    assert len(_evaluations(sent)) == records.count()


def test_the_evaluator_goes_to_a_live_cluster_a_gpu_one_first_else_the_control_queue(db: Any) -> None:
    cpu = _cluster("1.000000", accelerator_type="cpu", accelerator_count=8)
    gpu = _cluster("2.000000", accelerator_type="A10G", accelerator_count=2)
    spare = _cluster("3.000000")
    run = _place(placement={"eval_cluster": spare.slug})
    assert {ln.cluster_id for ln in TrainingLearner.objects.filter(run=run)} == {cpu.pk, gpu.pk}
    assert services.evaluator_queue(run) == (cluster_queue(spare.slug), spare.slug)
    _down(spare)  # the named cluster is down: the run's own, a GPU cluster first
    assert services.evaluator_queue(run) == (cluster_queue(gpu.slug), gpu.slug)
    _down(gpu)
    assert services.evaluator_queue(run) == (cluster_queue(cpu.slug), cpu.slug)
    _down(cpu)
    assert services.evaluator_queue(run) == (CONTROL_QUEUE, "control")


def test_a_lapsed_evaluator_is_sent_again(
    db: Any, sent: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    run = _running()
    _train_and_tick(run, 1, django_capture_on_commit_callbacks)
    assert len(_evaluations(sent)) == 1
    # Its task was lost (the worker died before it started): once the hold lapses, a tick sends another.
    TrainingRun.objects.filter(pk=run.pk).update(evaluator_until=timezone.now())
    _train_and_tick(run, 1, django_capture_on_commit_callbacks)
    assert len(_evaluations(sent)) == 2


def test_the_store_keeps_what_a_pending_evaluation_reads(
    db: Any, django_capture_on_commit_callbacks: Any, sent: list[Any]
) -> None:
    run = _running(syncer={"grace_seconds": 0.0, "keep_versions": 1}, register_every_versions=0)
    _train_and_tick(run, 4, django_capture_on_commit_callbacks)
    transport = run_transport(run)
    recorded = sorted(GlobalVersionRecord.objects.filter(run=run).values_list("version", flat=True))
    assert len(recorded) >= 4
    # None evaluated yet (version 0 was, at placement): every other one kept.
    assert [v for v in transport.versions(0) if v > 0] == recorded[1:]
    services.versions_evaluate(run_id=run.pk)
    _train_and_tick(run, 1, django_capture_on_commit_callbacks)  # the next sweep may free them
    assert len(transport.versions(0)) < len(recorded) - 1


def test_a_version_gone_from_the_store_is_noted_and_not_retried(
    db: Any, django_capture_on_commit_callbacks: Any, sent: list[Any]
) -> None:
    run = _running()
    _train_and_tick(run, 1, django_capture_on_commit_callbacks)
    gone = GlobalVersionRecord.objects.filter(run=run).order_by("-version").first()
    assert gone is not None and gone.version > 0
    run_transport(run).delete_version(0, gone.version)
    services.versions_evaluate(run_id=run.pk)
    gone.refresh_from_db()
    assert gone.eval_loss is None and "no longer in the store" in gone.eval_note
    assert services.pending_evaluation(run) == []
    assert GlobalVersionRecord.objects.get(run=run, version=0).eval_loss is not None


def test_an_unknown_eval_cluster_is_refused_naming_the_field(db: Any) -> None:
    with pytest.raises(RunConfigError) as refused:
        run_config_validate(tiny_run_config(placement={"eval_cluster": "no-such-cluster"}))
    assert "placement.eval_cluster" in refused.value.errors


def test_the_supervisor_sends_an_evaluator_where_versions_wait_unheld_finished_runs_too(
    db: Any, sent: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    run = _running()
    _train_and_tick(run, 1, django_capture_on_commit_callbacks)
    assert len(_evaluations(sent)) == 1
    assert services.training_runs_supervise()["evaluators_sent"] == 0  # the sent one holds the run
    # Its task was lost and the run ended meanwhile: no tick will come; beat's check sends one.
    TrainingRun.objects.filter(pk=run.pk).update(evaluator_until=None)
    services.training_run_cancel(run=run, reason="enough", by=None)
    with django_capture_on_commit_callbacks(execute=True):
        counts = services.training_runs_supervise()
    assert counts["evaluators_sent"] == 1 and len(_evaluations(sent)) == 2


def test_a_superseded_evaluator_does_nothing_and_a_failing_version_is_noted_after_three_tries(
    db: Any, sent: list[Any], django_capture_on_commit_callbacks: Any, monkeypatch: Any
) -> None:
    run = _running()
    _train_and_tick(run, 1, django_capture_on_commit_callbacks)
    (_, first), _ = _evaluations(sent)[0]
    # Its hold lapsed and another was sent: the first one, arriving late, evaluates nothing.
    TrainingRun.objects.filter(pk=run.pk).update(evaluator_until=timezone.now())
    with django_capture_on_commit_callbacks(execute=True):
        assert services.versions_evaluate_send(run)
    assert services.versions_evaluate(run_id=run.pk, token=first, limit=1) == 0
    run.refresh_from_db()
    assert run.evaluator_token not in ("", first)
    # A version whose evaluation crashes is tried MAX_EVAL_ATTEMPTS times, then noted.
    engine = run_engine(run)

    def crash(params: Any) -> float:
        raise MemoryError("out of memory")

    monkeypatch.setattr(engine, "evaluate", crash)
    for _ in range(services.evaluation.MAX_EVAL_ATTEMPTS):
        (_, token), _ = _evaluations(sent)[-1]
        with pytest.raises(MemoryError), django_capture_on_commit_callbacks(execute=True):
            services.versions_evaluate(run_id=run.pk, token=token, limit=1)
    (_, token), _ = _evaluations(sent)[-1]
    with django_capture_on_commit_callbacks(execute=True):
        services.versions_evaluate(run_id=run.pk, token=token, limit=1)
    crashed = GlobalVersionRecord.objects.get(run=run, version=1)
    assert crashed.eval_loss is None and crashed.eval_attempts == services.evaluation.MAX_EVAL_ATTEMPTS
    assert "failed 3 times" in crashed.eval_note and services.pending_evaluation(run) == []


def test_a_backlog_past_its_bound_is_skipped_oldest_first(
    db: Any, sent: list[Any], django_capture_on_commit_callbacks: Any, monkeypatch: Any
) -> None:
    _cluster("1.000000")
    _cluster("2.000000")
    monkeypatch.setattr(services.evaluation, "EVAL_BACKLOG", 2)
    run = _place(syncer={"grace_seconds": 0.0, "keep_versions": 1})
    _train_and_tick(run, 4, django_capture_on_commit_callbacks)
    waiting = [r.version for r in services.pending_evaluation(run)]
    assert len(waiting) == 4
    services.versions_evaluate(run_id=run.pk)
    records = {r.version: r for r in GlobalVersionRecord.objects.filter(run=run, version__gt=0)}
    assert [v for v in waiting if "skipped" in records[v].eval_note] == waiting[:2]
    assert all(records[v].eval_loss is not None for v in waiting[2:])


def test_a_task_starts_no_version_past_its_seconds_but_always_one(
    db: Any, sent: list[Any], django_capture_on_commit_callbacks: Any
) -> None:
    run = _running()
    _train_and_tick(run, 3, django_capture_on_commit_callbacks)
    waiting = len(services.pending_evaluation(run))
    assert waiting >= 3
    assert services.versions_evaluate(run_id=run.pk, seconds=0.0) == 1
    assert services.versions_evaluate(run_id=run.pk, seconds=60.0) == waiting - 1
