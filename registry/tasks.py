"""Housekeeping tasks of the control queue."""

from __future__ import annotations

from celery import shared_task

from registry import services


@shared_task(name="stack.cluster_health_check", ignore_result=True, acks_late=False)
def cluster_health_check() -> int:
    """Periodic (beat): mark silent clusters degraded or down."""
    return len(services.cluster_health_check())
