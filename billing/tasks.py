"""Periodic billing work (control queue)."""

from __future__ import annotations

from celery import shared_task

from billing.budgets import AlertDeliveryError, budget_alert_deliver
from billing.exports import export_job_run
from billing.rollups import rollups_update


@shared_task(name="billing.rollups_update", ignore_result=True)
def rollups_update_task() -> int:
    """Fold new ledger rows into the daily rollups (idempotent; safe to overlap)."""
    return rollups_update()


# Sent to the control queue by billing.exports.export_job_create.
@shared_task(name="billing.export_job_run", ignore_result=True)
def export_job_run_task(job_id: int) -> None:
    """Write an export job's files and signed manifest to the object store (idempotent)."""
    export_job_run(job_id=job_id)


@shared_task(
    name="billing.budget_alert_deliver",
    ignore_result=True,
    # No queue= (deprecated in Celery 5.x): it goes to CELERY_TASK_DEFAULT_QUEUE, "control".
    # Only transient delivery failures (SMTP or webhook unreachable, 5xx, 429)
    # are retried, with exponential backoff capped at 10 minutes, 8 times.
    autoretry_for=(AlertDeliveryError,),
    retry_backoff=True,
    retry_backoff_max=600,
    retry_jitter=True,
    max_retries=8,
)
def budget_alert_deliver_task(alert_id: int) -> None:
    """Email and webhook for one budget alert; each channel is sent at most once."""
    budget_alert_deliver(alert_id=alert_id)
