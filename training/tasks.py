"""Celery tasks for training jobs (run on cluster queues)."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from training import services


@shared_task(bind=True, name="training.probe_job_run", ignore_result=True)
def probe_job_run(self: Any, job_id: int) -> None:
    services.probe_job_execute(job_id=job_id, worker_hostname=self.request.hostname)
