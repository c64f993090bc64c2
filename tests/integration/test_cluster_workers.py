"""Cluster workers, heartbeats, beat and the control worker as real processes."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from django.db import close_old_connections

from billing.models import UsageRecord
from registry.auth.roles import Role
from registry.models import Cluster, FailoverEvent, WorkerHeartbeat
from tests.factories import api_client, make_cluster, make_user
from tests.integration.processes import Processes, wait_until
from training.models import ProbeJob

pytestmark = pytest.mark.integration


def _status(slug: str) -> str:
    close_old_connections()
    return Cluster.objects.get(slug=slug).status


def test_a_killed_worker_turns_its_cluster_down_and_a_restart_heals_it(processes: Processes) -> None:
    cluster = make_cluster(slug=f"it-{uuid.uuid4().hex[:8]}")
    processes.start("control", "worker", "--control", "--loglevel", "warning")
    processes.start("beat", "beat", "--loglevel", "warning")
    processes.start("worker", "worker", "--cluster", cluster.slug, "--loglevel", "warning")

    wait_until(lambda: _status(cluster.slug) == "healthy", timeout=90, what="first heartbeat")
    assert WorkerHeartbeat.objects.filter(cluster=cluster, hostname__startswith=f"{cluster.slug}@").exists()
    assert not FailoverEvent.objects.filter(from_cluster=cluster).exists()

    processes.kill("worker")
    wait_until(
        lambda: _status(cluster.slug) == "down",
        timeout=60,
        what="beat to mark the cluster down\n" + processes.log("control") + processes.log("beat"),
    )
    events = list(FailoverEvent.objects.filter(from_cluster=cluster))
    assert len(events) == 1
    event = events[0]
    assert event.kind == FailoverEvent.Kind.CLUSTER_HEALTH
    assert event.from_provider_id == cluster.provider_id
    assert "no worker heartbeat" in event.reason
    assert event.recovered_at is None

    processes.start("worker-again", "worker", "--cluster", cluster.slug, "--loglevel", "warning")
    wait_until(lambda: _status(cluster.slug) == "healthy", timeout=90, what="recovery heartbeat")
    event.refresh_from_db()
    assert event.recovered_at is not None
    assert event.time_lost is not None and event.time_lost.total_seconds() > 0
    assert FailoverEvent.objects.filter(from_cluster=cluster).count() == 1


def test_a_probe_job_posted_to_the_api_runs_on_its_cluster_worker_and_is_billed(
    processes: Processes,
) -> None:
    price = Decimal("3.600000")
    cluster = make_cluster(slug=f"it-{uuid.uuid4().hex[:8]}", price=price)
    other = make_cluster(slug=f"it-{uuid.uuid4().hex[:8]}")
    client = api_client(make_user(Role.OPERATOR))
    processes.start("worker", "worker", "--cluster", cluster.slug, "--loglevel", "warning")
    processes.start("other", "worker", "--cluster", other.slug, "--loglevel", "warning")

    response = client.post("/api/probe-jobs/", {"cluster": cluster.slug, "steps": 60}, format="json")
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]

    def finished() -> ProbeJob | None:
        close_old_connections()
        job = ProbeJob.objects.get(pk=job_id)
        return job if job.is_finished else None

    job = wait_until(finished, timeout=180, what="the probe job\n" + processes.log("worker"))
    assert job.status == ProbeJob.Status.SUCCEEDED, job.error
    # It ran on the chosen cluster's worker, not the other one.
    assert job.worker_hostname.startswith(f"{cluster.slug}@")
    assert job.attempts == 1
    assert job.loss_curve[-1][1] < job.loss_curve[0][1]
    record = UsageRecord.objects.get(idempotency_key=f"probe_job:{job_id}")
    assert record.cluster_id == cluster.pk
    assert record.unit_price == price
    assert record.price_book.cluster_id == cluster.pk
    assert record.quantity == (job.accelerator_seconds / Decimal(3600)).quantize(Decimal("1e-9"))
    assert record.amount == (record.quantity * price).quantize(Decimal("1e-9"))

    api_view = client.get(f"/api/probe-jobs/{job_id}/").json()
    assert api_view["status"] == "succeeded"
    assert len(api_view["loss_curve"]) == len(job.loss_curve)
