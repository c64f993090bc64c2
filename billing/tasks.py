"""Periodic billing work (control queue)."""

from __future__ import annotations

from celery import shared_task

from billing.exports import export_job_run
from billing.rollups import rollups_update


@shared_task(name="billing.rollups_update", ignore_result=True)
def rollups_update_task() -> int:
    """Fold new ledger rows into the daily rollups (idempotent; safe to overlap)."""
    return rollups_update()


@shared_task(name="billing.export_job_run", ignore_result=True, queue="control")
def export_job_run_task(job_id: int) -> None:
    """Write an export job's files and signed manifest to the object store (idempotent)."""
    export_job_run(job_id=job_id)
