"""The broker dies and comes back under a training run and a batch job: nothing exits, nothing stalls,
nothing is billed twice.

A private `redis-server` (its own port, no persistence: a restart loses every queued and unacked
message) is the broker of every process here: two cluster workers, two control workers, beat, and
this test process. It is SIGKILLed, and started again 3 s later, while learner chunks run on both
clusters, one control worker is in the middle of a batch job and the other waits on a countdown
task: each holds unacknowledged messages, the case that made kombu's Redis transport crash the
worker (stack/redis_broker.py).

As in production, the same Redis also holds the router's circuit breakers and route generation
(REDIS_URL) for the worker processes: while it is away they fail open (inference.breaker.breakers), so
batch lines routed then are answered rather than failing the job.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis
from django.db import close_old_connections
from django.db.models import Count

from bench.mockprovider import Behaviour, MockProviderServer
from billing.models import UsageRecord
from billing.selectors import ledger_verify
from inference.batch import jobs as batch
from inference.models import BatchJob, InferenceRequest
from registry.auth.roles import Role
from registry.models import Cluster
from stack.celery import app
from tests.factories import make_cluster, make_user, tiny_run_config
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.integration.processes import Processes, wait_until
from tests.integration.redis_server import RedisServer, redis_server
from training.models import GlobalVersionRecord, LearnerChunk, TrainingRun
from training.services import training_run_create

LINES = 30
PROCESSES = ("control0", "control1", "beat", "cluster-a", "cluster-b")

pytestmark = [pytest.mark.integration, pytest.mark.redis_server]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RedisServer]:
    # Requested before `processes`, so it goes down after the workers are stopped.
    with redis_server(tmp_path) as server:
        yield server


@contextmanager
def _publishing_to(url: str) -> Iterator[None]:
    """Point this process's Celery app (the one `training_run_create` and `batch_job_create`
    publish with) at `url`, and back afterwards."""
    before = app.conf.broker_url, app.conf.broker_transport_options

    def reset_pools() -> None:
        app._pool = None
        app.amqp._producer_pool = None

    app.conf.broker_url = url
    app.conf.broker_transport_options = {"visibility_timeout": 3600}
    reset_pools()
    try:
        yield
    finally:
        app.conf.broker_url, app.conf.broker_transport_options = before
        reset_pools()


def _versions(run_id: int) -> int:
    close_old_connections()
    return GlobalVersionRecord.objects.filter(run_id=run_id).count()


def _job(pk: int) -> BatchJob:
    close_old_connections()
    return BatchJob.objects.get(pk=pk)


def _healthy(*clusters: Cluster) -> bool:
    close_old_connections()
    return Cluster.objects.filter(pk__in=[c.pk for c in clusters], status="healthy").count() == len(clusters)


def _chunk_running(run_id: int) -> bool:
    close_old_connections()
    return LearnerChunk.objects.filter(learner__run_id=run_id, finished_at__isnull=True).exists()


def _held_unacked(broker: RedisServer, task_id: str) -> bool:
    """The message of task `task_id` is delivered to a worker and not acknowledged yet."""
    client = redis.Redis.from_url(broker.url)
    try:
        return any(task_id.encode() in raw for raw in client.hvals("unacked"))
    finally:
        client.close()


def _logs(processes: Processes) -> str:
    return "\n".join(f"--- {n}\n{processes.log(n)[-3000:]}" for n in PROCESSES)


def test_workers_and_beat_survive_a_broker_restart_and_the_run_and_the_batch_job_finish_billed_once(
    broker: RedisServer, processes: Processes, settings: Any, tmp_path: Path
) -> None:
    store_url = f"file://{tmp_path / 'objects'}"
    settings.OBJECT_STORE_URL = store_url
    env = {
        "CELERY_BROKER_URL": broker.url,
        "REDIS_URL": broker.url,
        "OBJECT_STORE_URL": store_url,
        "SWITCHYARD_TRAINING_SUPERVISE_SECONDS": "1",
        "SWITCHYARD_BATCH_PART_LINES": "5",
        "SWITCHYARD_BATCH_STALE_SECONDS": "3",
        "SWITCHYARD_BATCH_RESUME_SECONDS": "1",
    }
    provider = MockProviderServer(Behaviour(text="answer", delay_ms=150)).start()
    a = make_cluster(price=Decimal("1.000000"), accelerator_count=2)
    b = make_cluster(price=Decimal("1.500000"), accelerator_count=2)
    operator = make_user(Role.OPERATOR)
    workflow = routed_workflow(operator, [priced_deployment(provider)])
    jsonl = "".join(
        json.dumps({"custom_id": f"row-{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
        for i in range(LINES)
    )
    try:
        with _publishing_to(broker.url):
            for name in ("control0", "control1"):
                processes.start(name, "worker", "--control", "--loglevel", "info", env=env)
            processes.start("beat", "beat", "--loglevel", "info", env=env)
            processes.start("cluster-a", "worker", "--cluster", a.slug, "--loglevel", "info", env=env)
            processes.start("cluster-b", "worker", "--cluster", b.slug, "--loglevel", "info", env=env)
            wait_until(lambda: _healthy(a, b), timeout=120, what="first heartbeats\n" + _logs(processes))

            run = training_run_create(
                config=tiny_run_config(stop={"outer_steps": 16}), created_by=None, name="it-broker"
            )
            wait_until(lambda: _versions(run.pk) >= 2, timeout=180, what="first merges\n" + _logs(processes))
            job = batch.batch_job_create(workflow=workflow, user=operator, input_jsonl=jsonl)
            wait_until(
                lambda: _job(job.pk).done >= 3 and _chunk_running(run.pk),
                timeout=120,
                what="the batch job under way with a chunk running\n" + _logs(processes),
            )
            # The control worker that is not running the job holds this one until its countdown.
            waiting = app.send_task("training.runs_supervise", queue="control", countdown=120)
            wait_until(
                lambda: _held_unacked(broker, waiting.id),
                timeout=60,
                what="the idle control worker to hold a countdown task\n" + _logs(processes),
            )
            before = _versions(run.pk)
            assert _job(job.pk).state == BatchJob.State.RUNNING
            assert not TrainingRun.objects.get(pk=run.pk).is_finished

            broker.restart(down_s=3.0)

            done = wait_until(
                lambda: (r := TrainingRun.objects.get(pk=run.pk)).is_finished and r,
                timeout=300,
                what="the run to finish after the restart\n" + _logs(processes),
            )
            finished = wait_until(
                lambda: (j := _job(job.pk)).state != BatchJob.State.RUNNING and j,
                timeout=180,
                what="the batch job to finish after the restart\n" + _logs(processes),
            )
            # Nobody exited: every worker noticed the loss, reconnected and went on consuming.
            exited = {n: p.returncode for n, p in processes.running.items() if p.poll() is not None}
            assert not exited, f"exited: {exited}\n{_logs(processes)}"
            for name in PROCESSES:
                log = processes.log(name)
                assert "Unrecoverable error" not in log, log[-3000:]
                if name != "beat":
                    assert log.count("Connected to redis://") >= 2, log[-3000:]
    finally:
        provider.stop()

    assert done.state == TrainingRun.State.SUCCEEDED, done.reason
    assert _versions(run.pk) > before  # merged after the restart: not stalled
    assert finished.state == BatchJob.State.SUCCEEDED, finished.error
    assert (finished.done, finished.failed, finished.total) == (LINES, 0, LINES)

    # Nothing billed twice. Training: one ledger row per billed chunk, under that chunk's key.
    # The workers still run: a learner's last chunk may close (and bill) just after the run
    # ended, so compare once every chunk of the run is closed, not in the middle of one.
    wait_until(
        lambda: not LearnerChunk.objects.filter(learner__run_id=run.pk, finished_at__isnull=True).exists(),
        timeout=120,
        what="the run's last chunks to close\n" + _logs(processes),
    )
    chunks = list(LearnerChunk.objects.filter(learner__run_id=run.pk, billed=True).select_related("learner"))
    assert chunks
    run_rows = UsageRecord.objects.filter(subject_type="training_run", subject_id=str(run.pk))
    assert sorted(run_rows.values_list("idempotency_key", flat=True)) == sorted(c.billing_key for c in chunks)
    # Batch: one recorded request per line, each with its input and output row.
    requests = InferenceRequest.objects.filter(client_request_id__startswith=f"batch:{job.pk}:")
    assert requests.count() == LINES
    assert not requests.values("client_request_id").annotate(n=Count("id")).filter(n__gt=1).exists()
    line_rows = UsageRecord.objects.filter(subject_type="inference_request")
    assert line_rows.count() == 2 * LINES
    assert set(line_rows.values_list("subject_id", flat=True)) == {str(r.pk) for r in requests}
    assert finished.cost == sum(r.cost for r in requests)
    assert ledger_verify().ok
