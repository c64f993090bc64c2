"""Probe jobs: dispatch to a cluster's queue, the real torch run, and its bill."""

from __future__ import annotations

import secrets
from decimal import Decimal
from typing import Any

import pytest
from celery.signals import after_task_publish
from django.contrib.auth.models import User

from billing.models import PriceBook, UsageRecord
from registry.models import Cluster
from registry.services import cluster_set_draining
from stack.celery import app as celery_app
from tests.factories import api_client, make_cluster
from training.models import ProbeJob
from training.services import probe_job_create, probe_job_execute

pytestmark = pytest.mark.django_db

PRICE = Decimal("1.100000")  # per accelerator-hour
STEPS = 20


@pytest.fixture
def cluster() -> Cluster:
    # A slug of its own: the enqueue test publishes to the real broker.
    return make_cluster(slug=f"probe-{secrets.token_hex(4)}", price=PRICE)


def _drain_queue(queue_name: str) -> list[Any]:
    """Take every message off a broker queue, as a worker of that queue would."""
    taken = []
    with celery_app.connection_for_read() as connection:
        queue = connection.SimpleQueue(queue_name)
        try:
            # The first message may take a poll interval to show; the rest are there.
            message = queue.get(block=True, timeout=10)
            while True:
                message.ack()
                taken.append(message)
                message = queue.get_nowait()
        except queue.Empty:
            pass
        finally:
            queue.queue.delete()  # unbind: this cluster's queue is never used again
            queue.close()
    return taken


def test_posting_a_probe_job_enqueues_it_on_the_cluster_queue_after_commit(
    cluster: Cluster, operator: User, django_capture_on_commit_callbacks: Any
) -> None:
    published: list[dict[str, Any]] = []

    def on_publish(sender: str, headers: dict[str, Any], routing_key: str, **kwargs: Any) -> None:
        published.append({"task": sender, "routing_key": routing_key, "argsrepr": headers.get("argsrepr")})

    after_task_publish.connect(on_publish, weak=False)
    try:
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            response = api_client(operator).post(
                "/api/probe-jobs/", {"cluster": cluster.slug, "steps": STEPS}, format="json"
            )
            assert response.status_code == 201, response.json()
            # Nothing is sent before the transaction commits.
            assert published == []
        job = ProbeJob.objects.get(pk=response.json()["id"])
        assert (job.status, job.steps, job.cluster, job.created_by) == ("pending", STEPS, cluster, operator)
        assert response.json()["status"] == "pending"
        assert len(callbacks) == 1

        callbacks[0]()  # what the commit does
        assert published == [
            {
                "task": "training.probe_job_run",
                "routing_key": f"cluster.{cluster.slug}",
                "argsrepr": f"({job.pk},)",
            }
        ]
    finally:
        after_task_publish.disconnect(on_publish)

    # The message really is on the cluster's queue (and is taken off it again here).
    messages = _drain_queue(f"cluster.{cluster.slug}")
    assert [(m.headers["task"], m.payload[0]) for m in messages] == [("training.probe_job_run", [job.pk])]


def test_running_a_probe_job_records_its_loss_curve_and_bills_it_once(
    cluster: Cluster, operator: User
) -> None:
    job = probe_job_create(cluster=cluster, created_by=operator, steps=STEPS)

    finished = probe_job_execute(job_id=job.pk, worker_hostname="unit-test@host")
    assert finished is not None
    job.refresh_from_db()
    assert job.status == ProbeJob.Status.SUCCEEDED, job.error
    assert (job.attempts, job.worker_hostname, job.error) == (1, "unit-test@host", "")
    assert job.device in {"cpu", "cuda"}
    assert job.started_at is not None and job.finished_at is not None
    assert job.started_at <= job.finished_at

    steps = [step for step, _ in job.loss_curve]
    losses = [loss for _, loss in job.loss_curve]
    assert steps[0] == 1 and steps[-1] == STEPS
    assert losses[-1] < losses[0]
    assert job.final_loss == pytest.approx(losses[-1], abs=1e-4)
    assert job.accelerator_seconds > 0

    record = UsageRecord.objects.get(subject_type="probe_job", subject_id=str(job.pk))
    assert record.idempotency_key == f"probe_job:{job.pk}"
    assert record.cluster == cluster
    assert record.provider == cluster.provider
    assert record.price_book == PriceBook.objects.get(cluster=cluster)
    assert record.unit == "accelerator_hour"
    assert record.unit_price == PRICE
    assert record.occurred_at == job.finished_at
    assert record.quantity == (job.accelerator_seconds / Decimal(3600)).quantize(Decimal("1e-9"))
    # Exact to the ledger's 9 places: quantity (9 places) × 1.10 has 10.
    assert record.amount == (record.quantity * record.unit_price).quantize(Decimal("1e-9"))
    assert record.amount == (record.quantity * PRICE).quantize(Decimal("1e-9"))

    # Redelivered or re-run: a finished job is a no-op, and nothing is billed twice.
    assert probe_job_execute(job_id=job.pk, worker_hostname="other@host") is None
    job.refresh_from_db()
    assert (job.attempts, job.worker_hostname) == (1, "unit-test@host")
    assert UsageRecord.objects.filter(subject_type="probe_job").count() == 1


def test_a_job_that_no_longer_exists_is_a_no_op() -> None:
    assert probe_job_execute(job_id=987654, worker_hostname="h") is None
    assert not UsageRecord.objects.exists()


def test_a_draining_cluster_refuses_probe_jobs_with_a_field_error(
    cluster: Cluster, operator: User, django_capture_on_commit_callbacks: Any
) -> None:
    cluster_set_draining(cluster=cluster, draining=True)
    with django_capture_on_commit_callbacks() as callbacks:
        response = api_client(operator).post(
            "/api/probe-jobs/", {"cluster": cluster.slug, "steps": STEPS}, format="json"
        )
    assert response.status_code == 400
    assert "draining" in response.json()["cluster"][0]
    assert not ProbeJob.objects.exists()
    assert callbacks == []


def test_a_cluster_without_a_price_refuses_probe_jobs_rather_than_run_work_it_cannot_bill(
    operator: User, django_capture_on_commit_callbacks: Any
) -> None:
    unpriced = make_cluster(price=None)
    with django_capture_on_commit_callbacks() as callbacks:
        response = api_client(operator).post(
            "/api/probe-jobs/", {"cluster": unpriced.slug, "steps": STEPS}, format="json"
        )
    assert response.status_code == 400
    assert "price" in response.json()["cluster"][0]
    assert not ProbeJob.objects.exists()
    assert callbacks == []


@pytest.mark.parametrize(("body", "field"), [({"steps": 9}, "steps"), ({"steps": 5001}, "steps"), ({}, None)])
def test_bad_probe_job_input_is_400_with_field_errors(
    cluster: Cluster, operator: User, body: dict[str, Any], field: str | None
) -> None:
    payload = {"cluster": cluster.slug, **body} if field else {"cluster": "no-such-cluster"}
    response = api_client(operator).post("/api/probe-jobs/", payload, format="json")
    assert response.status_code == 400
    assert (field or "cluster") in response.json()
    assert not ProbeJob.objects.exists()


def test_probe_job_results_are_read_only_through_the_api(cluster: Cluster, operator: User) -> None:
    job = probe_job_create(cluster=cluster, created_by=operator, steps=STEPS)
    client = api_client(operator)
    assert (
        client.patch(f"/api/probe-jobs/{job.pk}/", {"status": "succeeded"}, format="json").status_code == 405
    )
    body = client.get(f"/api/probe-jobs/{job.pk}/").json()
    assert (body["status"], body["cluster"], body["created_by"]) == (
        "pending",
        cluster.slug,
        operator.username,
    )


def test_a_probe_whose_price_vanished_after_dispatch_fails_saying_why_instead_of_hanging(
    operator: User,
) -> None:
    cluster = make_cluster(price=None)
    job = ProbeJob.objects.create(cluster=cluster, created_by=operator, steps=10)
    finished = probe_job_execute(job_id=job.pk, worker_hostname="w@host")
    assert finished is not None
    assert finished.status == ProbeJob.Status.FAILED
    assert finished.error.startswith("not billed: no accelerator_hour price in force")
    assert finished.loss_curve  # the training outcome is kept
    assert not UsageRecord.objects.filter(subject_type="probe_job", subject_id=str(job.pk)).exists()
