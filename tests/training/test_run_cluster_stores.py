"""Clusters with stores of their own (issue 30, item 3): a learner's checkpoints live in its
cluster's store, its deltas cross to the run's store and a moved learner's checkpoint crosses
between stores; every crossing is measured and billed as the source cluster's egress, and
re-placement weighs that egress. Chunks run in-process (real workers: tests/integration)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from billing.models import Unit, UsageRecord
from registry.auth.roles import Role
from registry.models import Cluster
from storage.objectstore import open_store
from tests.factories import make_cluster, make_price, make_user, tiny_run_config
from training import orchestrator, services
from training.models import LearnerChunk, PlacementDecision, TrainingLearner, TrainingRun

GB = Decimal(10**9)


def _cluster(slug: str, *, price: str, egress: str | None, store: Path | None) -> Cluster:
    cluster = make_cluster(
        slug=slug,
        price=Decimal(price),
        accelerator_count=2,
        capacity=2,
        object_store_url=f"file://{store}" if store is not None else "",
    )
    if egress is not None:
        make_price(cluster=cluster, unit=Unit.EGRESS_GB, unit_price=Decimal(egress))
    Cluster.objects.filter(pk=cluster.pk).update(status="healthy", last_heartbeat_at=timezone.now())
    cluster.refresh_from_db()
    return cluster


def _files(root: Path, under: str) -> dict[str, int]:
    """Every file under `root/under` with its size (what the store holds, read from the disk)."""
    base = root / under
    return {p.relative_to(root).as_posix(): p.stat().st_size for p in base.rglob("*") if p.is_file()}


@pytest.fixture
def stores(db: Any, tmp_path: Path, settings: Any) -> dict[str, Path]:
    settings.CLUSTER_STORE_FILE_ROOT = tmp_path / "clusters"
    found = {"east": tmp_path / "clusters" / "east", "west": tmp_path / "clusters" / "west"}
    for path in found.values():
        path.mkdir(parents=True)
    return found


def _run(**placement: Any) -> TrainingRun:
    config = tiny_run_config(learners={"count": 2, "quorum": 1, "batch_size": 4})
    if placement:
        config["placement"] = placement
    run = services.training_run_create(config=config, created_by=None, name="stores")
    services.training_run_place(run_id=run.pk)
    run.refresh_from_db()
    assert run.state == TrainingRun.State.RUNNING, run.reason
    return run


def _egress_rows(run: TrainingRun) -> list[UsageRecord]:
    return list(
        UsageRecord.objects.filter(subject_id=str(run.pk), unit=Unit.EGRESS_GB).select_related("cluster")
    )


def test_checkpoints_stay_in_each_clusters_store_and_the_deltas_that_left_it_are_billed_as_egress(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    east = _cluster("east", price="1.00", egress="0.09", store=stores["east"])
    west = _cluster("west", price="1.50", egress="0.02", store=stores["west"])
    run = _run()
    learners = {
        ln.cluster.slug: ln for ln in TrainingLearner.objects.filter(run=run).select_related("cluster")
    }
    assert set(learners) == {"east", "west"}  # spread over both
    for seq in range(2):
        for learner in learners.values():
            orchestrator.learner_chunk_execute(
                learner_id=learner.pk, generation=0, seq=seq, worker_hostname="w@1"
            )

    # Each learner's checkpoints are in its own cluster's store, none in the run's.
    for slug, learner in learners.items():
        held = _files(stores[slug], f"runs/{run.pk}/learners")
        assert held and all(f"/l{learner.index:04d}/" in key for key in held), held
    assert not (tmp_path / "runs" / str(run.pk) / "learners").exists()
    chunks = LearnerChunk.objects.filter(learner__run=run).select_related("cluster")
    for chunk in chunks:
        assert chunk.checkpoint_bytes > 0 and chunk.checkpoint_moved_bytes == 0

    # The deltas crossed to the run's store: what the ledger bills as each cluster's egress is
    # what the run's store holds (no syncer ran, so every pushed delta is still there).
    deltas = _files(tmp_path, f"runs/{run.pk}/deltas")
    assert deltas
    rows = _egress_rows(run)
    assert {r.cluster.slug for r in rows} == {"east", "west"}
    assert sum(r.quantity for r in rows) * GB == sum(deltas.values())
    for cluster, rate in ((east, Decimal("0.09")), (west, Decimal("0.02"))):
        sent = sum(c.bytes_sent for c in chunks if c.cluster_id == cluster.pk)
        mine = [r for r in rows if r.cluster_id == cluster.pk]
        assert sum(r.quantity for r in mine) * GB == sent > 0
        assert all(r.amount == (r.quantity * rate).quantize(Decimal("1e-9")) for r in mine)
    # One egress row per chunk that pushed, idempotent with its chunk's bill.
    assert len(rows) == len({r.idempotency_key for r in rows}) == sum(1 for c in chunks if c.bytes_sent)

    # After a publish the run's store bytes count what its clusters' stores hold for it too.
    orchestrator.syncer_tick_execute(run_id=run.pk, token=run.syncer_token)
    run.refresh_from_db()
    held = [
        _files(tmp_path, f"runs/{run.pk}"),
        _files(stores["east"], "runs"),
        _files(stores["west"], "runs"),
    ]
    assert run.store_bytes == sum(sum(f.values()) for f in held) > sum(held[0].values())

    # The run's cost split shows data movement beside compute.
    from training.selectors import run_cost_per_cluster

    units = {(r["cluster"], r["unit"]) for r in run_cost_per_cluster(run=run)}
    assert {("east", "egress_gb"), ("west", "egress_gb"), ("east", "accelerator_hour")} <= units
    page = Client()
    page.force_login(make_user(Role.OPERATOR))
    html = page.get(f"/training/{run.pk}/").content.decode()
    assert html.count('class="run-cost-egress_gb"') == 2 and "data moved out (GB)" in html


def test_a_learner_moved_to_another_store_carries_its_checkpoint_across_billed_once_as_egress(
    stores: dict[str, Path],
) -> None:
    east = _cluster("east", price="1.00", egress="0.09", store=stores["east"])
    west = _cluster("west", price="1.50", egress="0.02", store=stores["west"])
    run = _run(pins={"0": "east", "1": "west"})
    learner = TrainingLearner.objects.get(run=run, index=0)
    for seq in range(2):
        orchestrator.learner_chunk_execute(
            learner_id=learner.pk, generation=0, seq=seq, worker_hostname="w@1"
        )
    before = _files(stores["east"], f"runs/{run.pk}/learners/l0000")
    newest = max(before)
    orchestrator._LEARNERS.clear()  # the next chunk runs in another process, on the other cluster

    services.learner_failover(learner_id=learner.pk, reason="worker lost", now=timezone.now())
    learner.refresh_from_db()
    assert learner.cluster_id == west.pk and learner.generation == 1
    decision = PlacementDecision.objects.get(run=run, learner_index=0, generation=1)
    by_slug = {c["cluster"]: c for c in decision.candidates}
    size = Decimal(before[newest])
    assert Decimal(by_slug["west"]["checkpoint_gb"]) * GB == size  # moving there pays the egress
    assert Decimal(by_slug["west"]["egress_cost"]) == size / GB * Decimal("0.09")
    assert Decimal(by_slug["east"]["checkpoint_gb"]) == 0  # staying in the same store does not

    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=1, seq=0, worker_hostname="w@2")
    chunk = LearnerChunk.objects.get(learner=learner, generation=1, seq=0)
    assert chunk.state_source == LearnerChunk.StateSource.CHECKPOINT, chunk.error
    assert chunk.checkpoint_key == newest
    assert chunk.checkpoint_moved_bytes == before[newest] and chunk.checkpoint_moved_from_id == east.pk
    # The checkpoint now lives where the learner trains; the source store let go of it.
    assert newest in _files(stores["west"], f"runs/{run.pk}/learners/l0000")
    assert newest not in _files(stores["east"], f"runs/{run.pk}/learners/l0000")
    moves = [r for r in _egress_rows(run) if "checkpoint-move" in r.idempotency_key]
    assert len(moves) == 1
    assert moves[0].cluster_id == east.pk and moves[0].quantity * GB == before[newest]

    # The same chunk run again (a crash after the copy) bills nothing more.
    LearnerChunk.objects.filter(pk=chunk.pk).delete()
    orchestrator._LEARNERS.clear()
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=1, seq=0, worker_hostname="w@3")
    assert len([r for r in _egress_rows(run) if "checkpoint-move" in r.idempotency_key]) == 1


def test_a_cluster_without_an_egress_price_moves_its_data_unbilled_and_says_so(
    stores: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    _cluster("east", price="1.00", egress=None, store=stores["east"])
    run = _run(pins={"0": "east", "1": "east"})
    learner = TrainingLearner.objects.get(run=run, index=0)
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@1")
    chunk = LearnerChunk.objects.get(learner=learner)
    assert chunk.bytes_sent > 0 and not chunk.error
    assert chunk.billed  # its compute is billed
    assert not _egress_rows(run)
    assert any("not billed" in r.getMessage() and "egress_gb" in r.getMessage() for r in caplog.records)


def test_learners_on_clusters_without_a_store_of_their_own_pay_no_egress(stores: dict[str, Path]) -> None:
    _cluster("east", price="1.00", egress="0.09", store=None)
    run = _run(pins={"0": "east", "1": "east"})
    learner = TrainingLearner.objects.get(run=run, index=0)
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@1")
    assert LearnerChunk.objects.get(learner=learner).bytes_sent > 0
    assert not _egress_rows(run)
    assert open_store(f"file://{stores['east']}").list() == []
