"""Ledger exports: FOCUS and CSV files written to the object store by a job."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from registry.models import (
    Team,
)


class ExportJob(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    filters = models.JSONField(default=dict, blank=True)
    formats = models.JSONField(default=list, help_text='e.g. ["csv", "jsonl", "parquet"]')
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    object_prefix = models.CharField(max_length=500, blank=True)
    manifest = models.JSONField(default=dict, blank=True)
    row_count = models.BigIntegerField(default=0)
    error = models.TextField(blank=True)
    # The teams whose ledger rows the job may hold (its filters' `teams` and `team`), set once
    # when it is made: a team-scoped caller lists a job whose teams are all among its own; a job
    # with none (every row, or a scope that named no team) is the platform's only.
    teams = models.ManyToManyField(Team, blank=True, related_name="+")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"export #{self.pk} ({self.status})"
