"""Training jobs. (DiLoCo runs arrive with the orchestration issue.)"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from stack.models import Cluster


class ProbeJob(models.Model):
    """A short real torch job that proves a cluster's dispatch, health and billing."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="probe_jobs")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    steps = models.PositiveIntegerField(
        default=300, validators=[MinValueValidator(10), MaxValueValidator(5000)]
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    worker_hostname = models.CharField(max_length=255, blank=True)
    device = models.CharField(max_length=16, blank=True)
    loss_curve = models.JSONField(default=list, blank=True)  # [[step, loss], ...]
    final_loss = models.FloatField(null=True, blank=True)
    accelerator_seconds = models.DecimalField(max_digits=18, decimal_places=3, default=Decimal("0"))
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # Overview's "recent jobs" and the jobs page.
            models.Index(fields=["-created_at"], name="probe_recent_idx"),
        ]

    def __str__(self) -> str:
        return f"probe #{self.pk} on {self.cluster.slug} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in (self.Status.SUCCEEDED, self.Status.FAILED)
