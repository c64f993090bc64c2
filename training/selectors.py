"""Reads for training jobs."""

from __future__ import annotations

from django.db.models import QuerySet

from training.models import ProbeJob


def probe_jobs_recent(*, limit: int = 20) -> QuerySet[ProbeJob]:
    return ProbeJob.objects.select_related("cluster", "created_by").order_by("-created_at")[:limit]
