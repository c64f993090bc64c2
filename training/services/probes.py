"""Probe jobs: dispatch to a cluster's queue, the claim, the run and its bill."""

from __future__ import annotations

import logging
import socket
from datetime import datetime
from decimal import Decimal

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from billing.budgets import budget_may_spend, spend_target
from billing.models import Unit
from billing.resource_bills import accelerator_time_bill
from billing.selectors import price_in_force
from billing.services import NoPriceError
from registry.claims import row_claim
from registry.errors import DomainError
from registry.models import Cluster
from training import dispatch
from training.models import ProbeJob
from training.probe import ProbeConfig, run_probe

logger = logging.getLogger(__name__)


class DispatchError(DomainError, ValueError):
    """Work that cannot be dispatched (a draining cluster, no price in force)."""


def probe_job_create(*, cluster: Cluster, created_by: User | None, steps: int = 300) -> ProbeJob:
    """Create a probe job and enqueue it on the cluster's queue once committed."""
    if cluster.status == Cluster.Status.DRAINING:
        raise DispatchError(f"cluster {cluster.slug} is draining", field="cluster")
    # Refuse up front what could not be billed at the end: without a price the
    # finished job's ledger write fails and the job would stay `running`.
    price = price_in_force(
        unit=Unit.ACCELERATOR_HOUR, at=timezone.now(), cluster=cluster, provider=cluster.provider
    )
    if price is None:
        raise DispatchError(f"cluster {cluster.slug} has no accelerator-hour price in force", field="cluster")
    # Hard-limit budgets of the cluster (and its provider) fail closed: a spent
    # budget stops new jobs. A read-only check: a probe costs cents and is billed
    # by another process minutes later (see billing.budgets for admit/settle).
    may_spend, why = budget_may_spend(target=spend_target(cluster=cluster, provider=cluster.provider))
    if not may_spend:
        raise DispatchError(why, field="cluster")
    job = ProbeJob.objects.create(cluster=cluster, created_by=created_by, steps=steps)
    job_id, slug = job.pk, cluster.slug
    transaction.on_commit(lambda: dispatch.probe_job_run_enqueue(job_id=job_id, cluster_slug=slug))
    return job


def probe_job_claim(*, job_id: int, worker_hostname: str) -> ProbeJob | None:
    """Claim a job for this worker; None when it is finished or gone (a no-op).

    A job still `running` may be claimed again: that happens when the worker
    that had it died and the broker redelivered the message.
    """
    claimed = row_claim(
        ProbeJob,
        pk=job_id,
        field="status",
        from_states=[ProbeJob.Status.PENDING, ProbeJob.Status.RUNNING],
        to_state=ProbeJob.Status.RUNNING,
        started_at=timezone.now(),
        worker_hostname=worker_hostname[:255],
        loss_curve=[],
        error="",
        attempts=F("attempts") + 1,
    )
    if not claimed:
        return None
    return ProbeJob.objects.select_related("cluster__provider").get(pk=job_id)


def probe_job_progress(*, job_id: int, loss_curve: list[tuple[int, float]]) -> None:
    """Save the loss curve so far of a running job."""
    ProbeJob.objects.filter(pk=job_id, status=ProbeJob.Status.RUNNING).update(
        loss_curve=[list(p) for p in loss_curve]
    )


def probe_job_finish(
    *,
    job: ProbeJob,
    succeeded: bool,
    wall_seconds: float,
    finished_at: datetime,
    loss_curve: list[tuple[int, float]],
    final_loss: float | None,
    device: str,
    error: str = "",
) -> ProbeJob:
    """Record the outcome and bill the accelerator-seconds, in one transaction."""
    # One accelerator group ran the probe; bill what it held for the run.
    accelerator_seconds = Decimal(str(round(wall_seconds, 3)))
    with transaction.atomic():
        updated = ProbeJob.objects.filter(pk=job.pk, status=ProbeJob.Status.RUNNING).update(
            status=ProbeJob.Status.SUCCEEDED if succeeded else ProbeJob.Status.FAILED,
            finished_at=finished_at,
            loss_curve=[list(p) for p in loss_curve],
            final_loss=final_loss,
            device=device,
            accelerator_seconds=accelerator_seconds,
            error=error[:5000],
        )
        if updated == 1:
            try:
                with transaction.atomic():  # a savepoint: a billing error keeps the outcome
                    accelerator_time_bill(
                        cluster=job.cluster,
                        seconds=accelerator_seconds,
                        accelerators=1,
                        subject_type="probe_job",
                        subject_id=str(job.pk),
                        idempotency_key=f"probe_job:{job.pk}",
                        at=finished_at,
                        description=f"probe job #{job.pk}: {accelerator_seconds}s on {job.cluster.slug}",
                    )
            except NoPriceError as exc:
                # The price vanished after dispatch (it is checked there): the
                # job must not stay `running` forever; it fails, saying why.
                logger.error("probe job %s could not be billed: %s", job.pk, exc)
                ProbeJob.objects.filter(pk=job.pk).update(
                    status=ProbeJob.Status.FAILED, error=f"not billed: {exc}"[:5000]
                )
    job.refresh_from_db()
    return job


def probe_job_execute(*, job_id: int, worker_hostname: str | None = None) -> ProbeJob | None:
    """Run a claimed probe job to completion (called by the worker task)."""
    job = probe_job_claim(job_id=job_id, worker_hostname=worker_hostname or socket.gethostname())
    if job is None:
        logger.info("probe job %s already finished or gone; nothing to do", job_id)
        return None
    curve: list[tuple[int, float]] = []

    def on_progress(step: int, loss: float) -> None:
        curve.append((step, round(loss, 5)))
        if len(curve) % 5 == 0:
            probe_job_progress(job_id=job_id, loss_curve=curve)

    started = timezone.now()
    try:
        result = run_probe(ProbeConfig(steps=job.steps), on_progress)
    except Exception as exc:
        finished = timezone.now()
        logger.exception("probe job %s failed", job_id)
        return probe_job_finish(
            job=job,
            succeeded=False,
            wall_seconds=(finished - started).total_seconds(),
            finished_at=finished,
            loss_curve=curve,
            final_loss=None,
            device="",
            error=f"{type(exc).__name__}: {exc}",
        )
    return probe_job_finish(
        job=job,
        succeeded=True,
        wall_seconds=result.wall_seconds,
        finished_at=timezone.now(),
        loss_curve=result.loss_curve,
        final_loss=result.final_loss,
        device=result.device,
    )
