"""Billing's Celery tasks (control queue), imported here so that the worker's autodiscovery finds them.

rollups_update_task is defined here. The two that billing's own code enqueues
are defined next to the work they run, so that the code enqueueing them needs
no import of this module: export_job_run_task in billing.exports.jobs (sent by
export_job_create) and budget_alert_deliver_task in billing.budgets.delivery
(sent by the ledger hook once a threshold alert commits).
"""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from billing.alerts import alert_delivery_send_task, spend_anomalies_detect, spend_digest_send
from billing.budgets import budget_alert_deliver_task
from billing.exports import export_job_run_task
from billing.rollups import rollups_update

__all__ = [
    "alert_delivery_send_task",
    "budget_alert_deliver_task",
    "export_job_run_task",
    "rollups_update_task",
    "spend_anomalies_detect_task",
    "spend_digest_send_task",
]


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
