"""Devices owned (issue 31, item 3): a worker offers its accelerators in its heartbeat; a chunk
owns disjoint ones of them while it runs, so learners never share a GPU on one worker, and a
chunk whose devices are all owned waits (its task retries) instead of stacking on them."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
import torch
from celery.exceptions import Retry
from django.utils import timezone

from registry.models import Cluster, WorkerHeartbeat
from registry.services import cluster_heartbeat
from registry.worker_signals import worker_devices
from tests.factories import make_cluster, tiny_run_config
from training import services, tasks
from training.engine.distributed import rank_device
from training.models import LearnerChunk, TrainingLearner, TrainingRun
from training.run_ranks import chunk_devices

WORKER = "cluster-a@host-1"
WORKER_STARTED = datetime(2026, 1, 1, tzinfo=UTC)  # before every chunk of these tests


def test_a_worker_offers_the_devices_its_environment_names_or_its_gpus() -> None:
    assert worker_devices({"SWITCHYARD_WORKER_DEVICES": "0,1, 3"}, gpus=8) == [0, 1, 3]
    assert worker_devices({"SWITCHYARD_WORKER_DEVICES": ""}, gpus=8) == []  # none, on purpose
    # CUDA_VISIBLE_DEVICES renumbers what the processes see: 2 visible GPUs are ordinals 0, 1.
    assert worker_devices({"CUDA_VISIBLE_DEVICES": "2,3"}, gpus=8) == [0, 1]
    assert worker_devices({"CUDA_VISIBLE_DEVICES": "-1"}, gpus=8) == []
    assert worker_devices({}, gpus=4) == [0, 1, 2, 3]
    assert worker_devices({}, gpus=0) == []
    for bad in ("0,x", "1,1", "-2"):
        with pytest.raises(ValueError, match="SWITCHYARD_WORKER_DEVICES"):
            worker_devices({"SWITCHYARD_WORKER_DEVICES": bad})


@pytest.fixture
def two_rank_run(db: Any) -> TrainingRun:
    """A running run of 2 learners of 2 ranks, both placed on one cluster that one worker serves."""
    cluster = make_cluster(price=Decimal("1.000000"), accelerator_count=4, capacity=2)
    Cluster.objects.filter(pk=cluster.pk).update(status="healthy", last_heartbeat_at=timezone.now())
    config = tiny_run_config(learners={"count": 2, "quorum": 1, "batch_size": 4, "ranks": 2})
    run = services.training_run_create(config=config, created_by=None, name="devices")
    services.training_run_place(run_id=run.pk)
    run.refresh_from_db()
    assert run.state == TrainingRun.State.RUNNING, run.reason
    assert set(TrainingLearner.objects.filter(run=run).values_list("cluster_id", flat=True)) == {cluster.pk}
    return run


def _offer(run: TrainingRun, devices: list[int]) -> None:
    cluster = TrainingLearner.objects.filter(run=run).first().cluster  # type: ignore[union-attr]
    cluster_heartbeat(
        cluster_slug=cluster.slug, hostname=WORKER, pid=1, started_at=WORKER_STARTED, devices=devices
    )


def _claim(run: TrainingRun, index: int, seq: int = 0) -> LearnerChunk:
    learner = TrainingLearner.objects.get(run=run, index=index)
    claim = services.learner_chunk_claim(
        learner_id=learner.pk, generation=learner.generation, seq=seq, worker_hostname=WORKER
    )
    assert claim is not None
    return claim.chunk


def test_two_learners_on_one_worker_own_disjoint_devices_and_a_third_claim_waits(
    two_rank_run: TrainingRun,
) -> None:
    run = two_rank_run
    _offer(run, [0, 1, 2, 3])
    assert WorkerHeartbeat.objects.get(hostname=WORKER).devices == [0, 1, 2, 3]
    first = _claim(run, 0)
    second = _claim(run, 1)
    assert (first.devices, second.devices) == ([0, 1], [2, 3])
    # Redelivered to the same worker (its process died): it takes its own devices back.
    assert _claim(run, 0).devices == [0, 1]

    # A worker with one device less: learner 1's next claim finds only [2] free and waits,
    # writing nothing (no chunk row, the learner's state untouched).
    LearnerChunk.objects.filter(pk=second.pk).update(finished_at=timezone.now())
    _offer(run, [0, 1, 2])
    learner = TrainingLearner.objects.get(run=run, index=1)
    with pytest.raises(
        services.DevicesBusy, match=r"offers devices \[0, 1, 2\], of which \[0, 1\] are owned"
    ):
        services.learner_chunk_claim(
            learner_id=learner.pk, generation=learner.generation, seq=1, worker_hostname=WORKER
        )
    assert not LearnerChunk.objects.filter(learner=learner, seq=1).exists()

    LearnerChunk.objects.filter(pk=first.pk).update(finished_at=timezone.now())  # learner 0's chunk ends
    assert _claim(run, 1, seq=1).devices == [0, 1]


def test_a_learner_s_next_chunk_on_a_worker_takes_its_previous_devices_back_when_they_are_free(
    two_rank_run: TrainingRun,
) -> None:
    """The worker kept the learner's rank group on those devices (training.engine.distributed):
    the next chunk finds it there instead of starting ranks on other GPUs beside it."""
    run = two_rank_run
    _offer(run, [0, 1, 2, 3])
    first, second = _claim(run, 0), _claim(run, 1)
    assert (first.devices, second.devices) == ([0, 1], [2, 3])
    LearnerChunk.objects.filter(pk__in=[first.pk, second.pk]).update(finished_at=timezone.now())
    # Learner 1 claims first: [0, 1] are free too, but it takes back its own [2, 3].
    assert _claim(run, 1, seq=1).devices == [2, 3]
    assert _claim(run, 0, seq=1).devices == [0, 1]


def test_chunks_that_will_never_finish_own_nothing(two_rank_run: TrainingRun) -> None:
    """A chunk left unfinished by a worker that died, or by a run that was cancelled, does not
    keep its devices: only live chunks of the worker's current process own any."""
    run = two_rank_run
    _offer(run, [0, 1])
    first = _claim(run, 0)
    assert first.devices == [0, 1]
    # The worker restarts (a new process, a new heartbeat start): the dead chunk owns nothing.
    WorkerHeartbeat.objects.filter(hostname=WORKER).update(started_at=timezone.now())
    assert _claim(run, 1).devices == [0, 1]
    # A cancelled run's unfinished chunks own nothing either.
    other = services.training_run_create(config=run.config, created_by=None, name="devices-2")
    TrainingRun.objects.filter(pk=run.pk).update(state=TrainingRun.State.CANCELLED)
    TrainingLearner.objects.filter(run=run).update(cluster=None)
    services.training_run_place(run_id=other.pk)
    other.refresh_from_db()
    assert other.state == TrainingRun.State.RUNNING, other.reason
    assert _claim(other, 0).devices == [0, 1]


def test_a_worker_with_fewer_devices_than_a_learners_ranks_loses_the_learner(
    two_rank_run: TrainingRun,
) -> None:
    _offer(two_rank_run, [0])  # one GPU, two ranks: no wait would help
    learner = TrainingLearner.objects.get(run=two_rank_run, index=0)
    claim = services.learner_chunk_claim(
        learner_id=learner.pk, generation=learner.generation, seq=0, worker_hostname=WORKER
    )
    assert claim is None and not LearnerChunk.objects.filter(learner=learner).exists()
    learner.refresh_from_db()
    assert learner.state == TrainingLearner.State.LOST
    assert learner.last_error == f"worker {WORKER} offers 1 device(s), fewer than learners.ranks (2)"


def test_a_worker_that_offers_no_devices_owns_none(two_rank_run: TrainingRun) -> None:
    _offer(two_rank_run, [])  # a CPU worker
    assert _claim(two_rank_run, 0).devices == _claim(two_rank_run, 1).devices == []
    assert chunk_devices([]) is None


def test_owned_devices_become_the_ranks_devices() -> None:
    if torch.cuda.is_available():
        assert chunk_devices([2, 3]) == [torch.device("cuda", 2), torch.device("cuda", 3)]
    else:
        assert chunk_devices([2, 3]) is None  # on the CPU, ranks stay there
    # A helper rank told its device uses it as is; told only "cuda", it takes its rank's.
    assert rank_device(1, torch.device("cuda", 3)) == torch.device("cuda", 3)
    assert rank_device(1, torch.device("cuda")).type == "cuda"
    assert rank_device(1, torch.device("cpu")) == torch.device("cpu")


def test_a_chunk_whose_devices_are_owned_is_retried_not_failed(
    two_rank_run: TrainingRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    def busy(**kwargs: Any) -> None:
        raise services.DevicesBusy("worker w offers devices [0], of which [0] are owned")

    monkeypatch.setattr(tasks, "learner_chunk_execute", busy)
    learner = TrainingLearner.objects.get(run=two_rank_run, index=0)
    with pytest.raises(Retry) as retried:  # what an eager apply raises where a worker re-queues
        tasks.learner_chunk_task.apply(args=(learner.pk, learner.generation, 0), throw=True)
    assert retried.value.when == tasks.DEVICES_BUSY_RETRY_SECONDS
    assert isinstance(retried.value.exc, services.DevicesBusy)
