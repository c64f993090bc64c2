"""Billing's Celery tasks (control queue): thin, the work is in the modules they call.

Billing's own code enqueues three of them by name (registry.queues.task_send), never importing
this module: export_job_run_task (export_job_create, once the job commits), and
alert_delivery_send_task and budget_alert_deliver_task (once an alert commits: alert_raise and
the budgets' ledger hook). billing.apps imports this module in every process, so a send by name
finds the task (and runs it in place under CELERY_TASK_ALWAYS_EAGER).
"""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from billing.alerts import (
    ALERT_DELIVERY_SEND,
    BUDGET_ALERT_DELIVER,
    alert_delivery_send,
    budget_alert_deliver,
    spend_anomalies_detect,
    spend_digest_send,
)
from billing.alerts.sending import DELIVERY_RETRY
from billing.exports import export_job_run
from billing.exports.jobs import EXPORT_JOB_RUN
from billing.rollups import rollups_update


@shared_task(name=EXPORT_JOB_RUN, ignore_result=True)
def export_job_run_task(job_id: int) -> None:
    """Write an export job's files and signed manifest to the object store (idempotent)."""
    export_job_run(job_id=job_id)


@shared_task(name=ALERT_DELIVERY_SEND, **DELIVERY_RETRY)
def alert_delivery_send_task(delivery_id: int) -> None:
    """One channel delivery (sent at most once; 5xx, 429 and unreachable retried with backoff)."""
    alert_delivery_send(delivery_id=delivery_id)


@shared_task(name=BUDGET_ALERT_DELIVER, **DELIVERY_RETRY)
def budget_alert_deliver_task(alert_id: int) -> None:
    """Email and webhook for one budget alert; each is sent at most once."""
    budget_alert_deliver(alert_id=alert_id)


@shared_task(name="billing.rollups_update", ignore_result=True)
def rollups_update_task() -> int:
    """Fold new ledger rows into the daily rollups (idempotent; safe to overlap)."""
    return rollups_update()


@shared_task(name="billing.spend_anomalies_detect", ignore_result=True)
def spend_anomalies_detect_task() -> int:
    """Judge today's spend per provider, workflow and cluster (idempotent: one anomaly per day)."""
    return len(spend_anomalies_detect(now=timezone.now()))


@shared_task(name="billing.spend_digest_send", ignore_result=True)
def spend_digest_send_task() -> int:
    """Yesterday's spend digest per team to the channels that take it (once per team and day)."""
    return len(spend_digest_send(now=timezone.now()))
