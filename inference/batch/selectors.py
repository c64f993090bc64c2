"""Reads for batch jobs: progress for the API and the batch job page."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db.models import QuerySet

from inference.models import BatchJob


def batch_jobs() -> QuerySet[BatchJob]:
    return BatchJob.objects.select_related("workflow", "created_by")


def batch_job_progress(*, job: BatchJob) -> dict[str, Any]:
    """done/total/failed/cost of a job; `fraction` counts failed lines as finished too."""
    finished = job.done + job.failed
    return {
        "state": job.state,
        "total": job.total,
        "done": job.done,
        "failed": job.failed,
        "remaining": max(0, job.total - finished),
        "fraction": (finished / job.total) if job.total else 0.0,
        "cost": job.cost if job.cost is not None else Decimal("0"),
    }
