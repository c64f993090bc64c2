"""A run's syncer ticks sweep its store: registered model versions and the newest K stay, the
rest go, the sweep logs what it freed, and the run page shows the bytes the run still holds."""

from __future__ import annotations

import logging
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import torch
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from registry.models import Cluster
from storage.objectstore import open_store
from tests.factories import make_cluster, tiny_run_config
from training import orchestrator, services
from training.engine.compression import Compressor
from training.engine.config import CompressionConfig, OuterConfig, SyncerConfig
from training.engine.messages import FragmentDelta
from training.engine.syncer import Syncer
from training.engine.transport import ObjectStoreTransport, Retention, object_sizes
from training.models import GlobalVersionRecord, ModelVersion, TrainingRun
from training.run_config import RunConfigError, run_config_validate
from training.run_engines import run_engine, run_transport


def test_keep_versions_defaults_to_three_and_must_be_at_least_one() -> None:
    assert run_config_validate(tiny_run_config())["syncer"]["keep_versions"] == 3
    with pytest.raises(RunConfigError) as err:
        run_config_validate(tiny_run_config(syncer={"keep_versions": 0}))
    assert "syncer.keep_versions" in err.value.errors


@pytest.fixture
def run(db: Any, tmp_path: Path) -> TrainingRun:
    for price in ("1.250000", "3.000000"):
        cluster = make_cluster(price=Decimal(price), accelerator_count=4, capacity=2)
        Cluster.objects.filter(pk=cluster.pk).update(status="healthy", last_heartbeat_at=timezone.now())
    config = tiny_run_config(syncer={"grace_seconds": 0.0, "keep_versions": 2}, register_every_versions=3)
    run = services.training_run_create(config=config, created_by=None, name="retention")
    services.training_run_place(run_id=run.pk)
    run.refresh_from_db()
    assert run.state == TrainingRun.State.RUNNING, run.reason
    return run


def _push(run: TrainingRun, seq: int, base: int) -> None:
    """Learner 0's delta on `base` (learner 1 has pushed nothing: it needs no version yet)."""
    engine = run_engine(run)
    tensors = {n: torch.full_like(engine.init[n], 1e-3 * (seq + 1)) for n in engine.fragments[0]}
    run_transport(run).put_delta(
        FragmentDelta(
            learner=0,
            fragment=0,
            base_version=base,
            seq=seq,
            steps=5,
            tokens=100,
            tensors=Compressor(CompressionConfig(kind="fp32")).compress(tensors),
        )
    )


def test_ticks_keep_registered_and_newest_versions_and_the_page_shows_the_bytes_left(
    run: TrainingRun, operator: User, caplog: pytest.LogCaptureFixture
) -> None:
    orchestrator._SYNCERS.clear()
    with caplog.at_level(logging.INFO, logger="training.services.retention"):
        for v in range(8):
            _push(run, seq=v, base=v)
            orchestrator.syncer_tick_execute(run_id=run.pk, token=run.syncer_token)
            services.versions_evaluate(run_id=run.pk)  # its evaluator, on a cluster's worker
            if v == 4:  # a fresh control worker: the syncer resumes from what the sweep left
                orchestrator._SYNCERS.clear()
    transport = run_transport(run)
    # Every version is recorded; versions 3 and 6 are registered model versions.
    assert GlobalVersionRecord.objects.filter(run=run, fragment=0).count() == 9
    assert sorted(ModelVersion.objects.filter(run=run).values_list("global_version", flat=True)) == [3, 6]
    # K = 2 keeps 7 and 8 (learner 0's base is 7); the registered ones survive; the rest are gone.
    assert transport.versions(0) == [3, 6, 7, 8]
    assert transport.delta_ids(0) == [f"l0000-f000-s{7:08d}"]
    assert "retention freed" in caplog.text
    run.refresh_from_db()
    assert run.store_bytes == sum(object_sizes(transport.store, f"runs/{run.pk}/").values()) > 0
    client = Client()
    client.force_login(operator)
    html = client.get(f"/training/{run.pk}/").content.decode()
    assert f"({run.store_bytes} bytes of versions" in html and "newest 2 versions" in html


class _Follower:
    """What `_fetch_versions` asks of a learner: its held version, and the two ways to move it."""

    def __init__(self, held: int) -> None:
        self.held_version = [held]
        self.received: list[int] = []
        self.full: list[int] = []

    def receive(self, down: Any) -> None:
        self.received.append(down.version)
        self.held_version[0] = down.version

    def receive_full(self, fragment: int, held: Any, version: int) -> None:
        self.full.append(version)
        self.held_version[0] = version


def test_a_learner_whose_chain_was_swept_fetches_the_newest_full_version(tmp_path: Path) -> None:
    init = {"w": torch.zeros(4)}
    transport = ObjectStoreTransport(open_store(f"file://{tmp_path}/objects"), prefix="runs/9")
    syncer = Syncer(
        cfg=SyncerConfig(learners=1),
        outer=OuterConfig(),
        fragments=[["w"]],
        init=init,
        transport=transport,
        down="int8",
    )
    for r in range(8):
        transport.put_delta(
            FragmentDelta(
                learner=0,
                fragment=0,
                base_version=r,
                seq=r,
                steps=1,
                tokens=1,
                tensors=Compressor(CompressionConfig(kind="fp32")).compress({"w": torch.full((4,), 0.1)}),
            )
        )
        syncer.pull(now=float(r))
        syncer.poll(now=float(r))
    # A learner on version 6 follows the two down-deltas after it.
    near = _Follower(held=6)
    assert orchestrator._fetch_versions(near, transport, 0, "int8") > 0  # type: ignore[arg-type]
    assert near.received == [7, 8] and near.full == []
    # Its versions swept (it was not live), a learner on version 5 gets version 8 whole.
    transport.sweep(Retention(keep_newest=1), {0: syncer.spent_deltas(0)})
    assert transport.versions(0) == [8]
    behind = _Follower(held=5)
    got = orchestrator._fetch_versions(behind, transport, 0, "int8")  # type: ignore[arg-type]
    # What it read is the version blob as stored (header included), measured as it crossed.
    stored = object_sizes(transport.store, "runs/9/versions/f000/")
    assert behind.received == [] and behind.full == [8] and got == sum(stored.values())
