"""Training runs end to end: real cluster workers, the control worker, beat, the broker and the store.

Each cluster is served by its own `manage.py worker --cluster` process; the syncer runs on the
control worker; beat drives the supervisor. Tiny models and short chunks keep each test short.
"""

from __future__ import annotations

import uuid
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db import close_old_connections
from django.db.models import Sum

from billing.models import UsageRecord
from registry.models import Cluster, FailoverEvent
from storage.objectstore import open_store
from tests.factories import make_cluster
from tests.integration.processes import Processes, wait_until
from training.engine.transport import ObjectStoreTransport
from training.models import (
    GlobalVersionRecord,
    LearnerChunk,
    PlacementDecision,
    TrainingLearner,
    TrainingRun,
)
from training.services import training_run_create
from training.tasks import syncer_tick_task

# One of the suite's trainers, which one pytest-xdist worker runs one after another
# (tests/xdist_workers.py, SERIAL_GROUPS).
pytestmark = pytest.mark.integration

FAST = {"SWITCHYARD_TRAINING_SUPERVISE_SECONDS": "1"}
CENT = Decimal("0.01")


@pytest.fixture(autouse=True)
def _run_store(tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every process of the test (this one and the workers it starts) uses tmp_path/objects:
    a run cannot choose its object store, the installation's OBJECT_STORE_URL decides."""
    url = f"file://{tmp_path / 'objects'}"
    settings.OBJECT_STORE_URL = url
    monkeypatch.setenv("OBJECT_STORE_URL", url)


def _config(**over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "model": {"n_layer": 1, "n_embd": 32, "n_head": 2, "block_size": 32},
        "data": {"max_train_bytes": 300_000, "max_eval_bytes": 30_000},
        "learners": {"count": 2, "quorum": 1, "batch_size": 8},
        "h": 150,
        "inner": {"lr": 3e-3, "warmup_steps": 10},
        # Every version stays in the store (retention keeps the newest 100), so that
        # _assert_versions_once can check that no delta was merged twice over the whole run;
        # the sweep itself is tested in tests/training/test_run_retention.py.
        "syncer": {"grace_seconds": 0.5, "keep_versions": 100},
        "stop": {"outer_steps": 6},
        "chunk_seconds": 2.0,
        "learner_timeout": 15.0,
        "eval_windows": 32,
    }
    cfg.update(over)
    return cfg


def _run(pk: int) -> TrainingRun:
    close_old_connections()
    return TrainingRun.objects.get(pk=pk)


def _healthy(*clusters: Cluster) -> bool:
    close_old_connections()
    return Cluster.objects.filter(pk__in=[c.pk for c in clusters], status="healthy").count() == len(clusters)


def _start(processes: Processes, *clusters: Cluster, controls: int = 1) -> None:
    for i in range(controls):
        processes.start(f"control{i}", "worker", "--control", "--loglevel", "info", env=FAST)
    processes.start("beat", "beat", "--loglevel", "warning", env=FAST)
    for c in clusters:
        processes.start(c.slug, "worker", "--cluster", c.slug, "--loglevel", "info", env=FAST)
    wait_until(lambda: _healthy(*clusters), timeout=120, what="cluster workers' first heartbeats")


def _logs(processes: Processes, *names: str) -> str:
    return "\n".join(f"--- {n}\n{processes.log(n)[-4000:]}" for n in names)


def _expected_cost(run: TrainingRun) -> Decimal:
    """Σ chunk seconds × accelerators × the cluster's price, per chunk, in the ledger's rounding."""
    total = Decimal(0)
    for chunk in LearnerChunk.objects.filter(learner__run=run).select_related("cluster"):
        price = chunk.cluster.prices.get(unit="accelerator_hour").unit_price
        total += chunk.accelerator_seconds / Decimal(3600) * chunk.accelerators * price
    return total


def _ledger_total(run: TrainingRun) -> Decimal:
    rows = UsageRecord.objects.filter(subject_type="training_run", subject_id=str(run.pk))
    return rows.aggregate(t=Sum("amount"))["t"] or Decimal(0)


def _finished(pk: int) -> TrainingRun | None:
    run = _run(pk)
    return run if run.is_finished else None


def _assert_versions_once(run: TrainingRun, store: Path) -> None:
    """Every stored version is recorded once; versions are contiguous; no delta was merged twice."""
    transport = ObjectStoreTransport(open_store(f"file://{store}"), prefix=f"runs/{run.pk}")
    for fragment in range(run.config["fragments"]["count"]):
        stored = transport.versions(fragment)
        assert stored == list(range(len(stored)))
        recorded = list(
            GlobalVersionRecord.objects.filter(run=run, fragment=fragment)
            .order_by("version")
            .values_list("version", flat=True)
        )
        assert recorded == stored
        merged = [d for v in stored for d in transport.get_version(fragment, v).merged]
        assert len(merged) == len(set(merged))


def test_a_two_cluster_run_completes_and_its_eval_loss_falls(processes: Processes, tmp_path: Path) -> None:
    cheap = make_cluster(slug=f"it-{uuid.uuid4().hex[:8]}", price=Decimal("1.000000"), accelerator_count=2)
    dear = make_cluster(slug=f"it-{uuid.uuid4().hex[:8]}", price=Decimal("2.500000"), accelerator_count=2)
    _start(processes, cheap, dear)
    store = tmp_path / "objects"

    run = training_run_create(config=_config(), created_by=None, name="it-plain")
    done = wait_until(
        lambda: _finished(run.pk),
        timeout=240,
        what="the run to end\n" + _logs(processes, "control0", cheap.slug),
    )
    assert done.state == TrainingRun.State.SUCCEEDED, done.reason
    assert done.initial_eval_loss is not None and done.final_eval_loss is not None
    assert done.final_eval_loss < done.initial_eval_loss
    # Spread over both clusters, cheapest first, with the prices that drove it.
    placements = {p.learner_index: p for p in PlacementDecision.objects.filter(run=done)}
    assert {placements[0].cluster_id, placements[1].cluster_id} == {cheap.pk, dear.pk}
    assert placements[0].cluster_id == cheap.pk and placements[0].unit_price == Decimal("1")
    assert all(p.reason == "initial" and p.price_book_id is not None for p in placements.values())
    # Both learners trained on their own cluster's worker.
    for learner in TrainingLearner.objects.filter(run=done):
        chunks = LearnerChunk.objects.filter(learner=learner)
        assert chunks.exists() and all(
            c.worker_hostname.startswith(f"{learner.cluster.slug}@") for c in chunks
        )
    _assert_versions_once(done, store)
    assert not FailoverEvent.objects.filter(training_run_id=done.pk).exists()
    # Every version's eval loss, filled in by the evaluator on a cluster's worker, not the control one.
    wait_until(
        lambda: not GlobalVersionRecord.objects.filter(run=done, eval_loss__isnull=True).exists(),
        timeout=60,
        what="every version evaluated\n" + _logs(processes, cheap.slug, dear.slug),
    )
    done.refresh_from_db()
    assert done.evaluator_queue in (cheap.slug, dear.slug)
    scored = list(GlobalVersionRecord.objects.filter(run=done, fragment=0).order_by("version"))
    assert scored[-1].eval_loss < scored[0].eval_loss == pytest.approx(done.initial_eval_loss)
    # The result is a registered model with lineage and cost.
    model = done.registered_model
    assert model is not None and model.produced_by_run_id == done.pk and model.family == "gpt-byte"
    assert model.artifact_uri.startswith(f"file://{store}/runs/{done.pk}/artifacts/final-")
    # Every chunk billed once, at its cluster's price.
    ledger = _ledger_total(done)
    assert ledger > 0
    assert ledger.quantize(CENT, ROUND_HALF_EVEN) == _expected_cost(done).quantize(CENT, ROUND_HALF_EVEN)
    assert (
        UsageRecord.objects.filter(subject_id=str(done.pk)).count()
        == LearnerChunk.objects.filter(learner__run=done, billed=True).count()
    )


def test_a_sigkilled_cluster_worker_fails_its_learner_over_and_the_run_completes(
    processes: Processes, tmp_path: Path
) -> None:
    cheap = make_cluster(slug=f"it-{uuid.uuid4().hex[:8]}", price=Decimal("1.000000"), accelerator_count=2)
    dear = make_cluster(slug=f"it-{uuid.uuid4().hex[:8]}", price=Decimal("2.500000"), accelerator_count=2)
    _start(processes, cheap, dear)
    store = tmp_path / "objects"
    # Quorum 2: the run cannot finish on the surviving learner alone, so the moved learner must
    # train on its new cluster (which closes the failover event) before the run completes.
    run = training_run_create(
        config=_config(stop={"outer_steps": 10}, learners={"count": 2, "quorum": 2, "batch_size": 8}),
        created_by=None,
        name="it-failover",
    )

    def first_chunk_on_cheap() -> bool:
        close_old_connections()
        return LearnerChunk.objects.filter(
            learner__run_id=run.pk, cluster=cheap, finished_at__isnull=False, steps__gt=0
        ).exists()

    wait_until(
        first_chunk_on_cheap,
        timeout=180,
        what="a chunk on the cheap cluster\n" + _logs(processes, cheap.slug),
    )
    assert not _run(run.pk).is_finished
    processes.kill(cheap.slug)

    done = wait_until(
        lambda: _finished(run.pk),
        timeout=240,
        what="the run to end after the kill\n" + _logs(processes, "control0", dear.slug),
    )
    assert done.state == TrainingRun.State.SUCCEEDED, done.reason
    events = list(FailoverEvent.objects.filter(training_run_id=done.pk))
    assert len(events) == 1
    event = events[0]
    assert event.kind == FailoverEvent.Kind.TRAINING
    # SIGKILLed: its cluster falls silent (heartbeat_timeout) or the learner stops reporting first.
    assert event.code in {"heartbeat_timeout", "worker_lost"}
    assert event.subject == f"training-run:{done.pk}/learner:0"
    assert event.from_cluster_id == cheap.pk and event.to_cluster_id == dear.pk
    assert event.recovered_at is not None and event.recovered_at >= event.detected_at
    assert event.tokens_lost is not None and event.tokens_lost >= 0
    moved = PlacementDecision.objects.get(run=done, learner_index=0, generation=1)
    assert moved.reason == PlacementDecision.Reason.FAILOVER and moved.cluster_id == dear.pk
    assert any(c["cluster"] == cheap.slug and c["rejected"] for c in moved.candidates)
    learner = TrainingLearner.objects.get(run=done, index=0)
    assert learner.generation == 1
    assert LearnerChunk.objects.filter(
        learner=learner, generation=1, finished_at__isnull=False, steps__gt=0
    ).exists()
    # The re-placed learner went on with its weights and AdamW state from the last checkpoint
    # its dead worker wrote, not from a fresh optimizer.
    restart = LearnerChunk.objects.get(learner=learner, generation=1, seq=0)
    assert restart.state_source == LearnerChunk.StateSource.CHECKPOINT
    assert restart.checkpoint_key.startswith(f"runs/{done.pk}/learners/l0000/g000000-c")
    states = list(done.transitions.values_list("to_state", flat=True))
    assert "recovering" in states and states[-1] == "succeeded"
    assert done.final_eval_loss is not None and done.initial_eval_loss is not None
    assert done.final_eval_loss < done.initial_eval_loss
    ledger = _ledger_total(done)
    assert ledger.quantize(CENT, ROUND_HALF_EVEN) == _expected_cost(done).quantize(CENT, ROUND_HALF_EVEN)
    _assert_versions_once(done, store)


def test_racing_and_killed_syncers_publish_and_record_each_version_once(
    processes: Processes, tmp_path: Path
) -> None:
    a = make_cluster(slug=f"it-{uuid.uuid4().hex[:8]}", price=Decimal("1.000000"), accelerator_count=2)
    b = make_cluster(slug=f"it-{uuid.uuid4().hex[:8]}", price=Decimal("1.500000"), accelerator_count=2)
    _start(processes, a, b, controls=2)
    store = tmp_path / "objects"
    run = training_run_create(config=_config(stop={"outer_steps": 8}), created_by=None, name="it-syncers")

    def versions_at_least(n: int) -> bool:
        close_old_connections()
        return GlobalVersionRecord.objects.filter(run_id=run.pk).count() >= n

    wait_until(
        lambda: versions_at_least(2), timeout=180, what="first merges\n" + _logs(processes, "control0")
    )
    # Extra ticks of the current chain: the two control workers now merge the same run at once.
    token = _run(run.pk).syncer_token
    for _ in range(20):
        syncer_tick_task.apply_async(args=(run.pk, token), queue="control")
    wait_until(lambda: versions_at_least(4), timeout=180, what="more merges")
    processes.kill("control0")  # mid-run, possibly mid-merge: no shutdown handler runs

    done = wait_until(
        lambda: _finished(run.pk), timeout=240, what="the run to end\n" + _logs(processes, "control1", "beat")
    )
    assert done.state == TrainingRun.State.SUCCEEDED, done.reason
    _assert_versions_once(done, store)


def test_after_every_process_is_killed_and_restarted_the_run_resumes_from_the_newest_version(
    processes: Processes, tmp_path: Path
) -> None:
    a = make_cluster(slug=f"it-{uuid.uuid4().hex[:8]}", price=Decimal("1.000000"), accelerator_count=2)
    b = make_cluster(slug=f"it-{uuid.uuid4().hex[:8]}", price=Decimal("1.500000"), accelerator_count=2)
    _start(processes, a, b)
    store = tmp_path / "objects"
    run = training_run_create(config=_config(stop={"outer_steps": 10}), created_by=None, name="it-restart")

    def versions() -> int:
        close_old_connections()
        return GlobalVersionRecord.objects.filter(run_id=run.pk).count()

    wait_until(lambda: versions() >= 3, timeout=180, what="first merges\n" + _logs(processes, "control0"))
    for name in list(processes.running):
        processes.kill(name)  # the whole stack at once, as a power cut would
    before = versions()
    assert not _run(run.pk).is_finished

    _start(processes, a, b)
    done = wait_until(
        lambda: _finished(run.pk),
        timeout=240,
        what="the run to resume and end\n" + _logs(processes, "control0", "beat"),
    )
    assert done.state == TrainingRun.State.SUCCEEDED, done.reason
    assert versions() > before
    _assert_versions_once(done, store)
    # Learners carried on from the newest global state, not from scratch.
    assert done.final_eval_loss is not None and done.initial_eval_loss is not None
    assert done.final_eval_loss < done.initial_eval_loss
    ledger = _ledger_total(done)
    assert ledger.quantize(CENT, ROUND_HALF_EVEN) == _expected_cost(done).quantize(CENT, ROUND_HALF_EVEN)
