"""The one failover log of the stack: what failed, why (a FailoverCode), what it cost."""

from __future__ import annotations

from decimal import Decimal

from django.db import models

from registry.failover_codes import FailoverCode
from registry.models.providers import Cluster, Deployment, Provider


class FailoverEvent(models.Model):
    """Every failover in the stack, written only by registry.services.failover_event_*."""

    class Kind(models.TextChoices):
        CLUSTER_HEALTH = "cluster-health", "Cluster health"
        TRAINING = "training", "Training"
        INFERENCE = "inference", "Inference"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    # What caused it, from the shared taxonomy (registry.failover_codes); `reason` is the
    # sentence a person reads, `code` what pages, the API, exports and alerts filter on.
    code = models.CharField(max_length=24, choices=FailoverCode.choices, default=FailoverCode.OTHER)
    from_provider = models.ForeignKey(
        Provider, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    to_provider = models.ForeignKey(
        Provider, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    from_cluster = models.ForeignKey(
        Cluster, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    to_cluster = models.ForeignKey(Cluster, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    from_deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    to_deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    subject = models.CharField(
        max_length=128, blank=True, help_text="what failed over, e.g. training-run:4/learner:1"
    )
    reason = models.CharField(max_length=500)
    detected_at = models.DateTimeField()
    recovered_at = models.DateTimeField(null=True, blank=True)
    time_lost = models.DurationField(null=True, blank=True)
    extra_cost = models.DecimalField(max_digits=20, decimal_places=9, default=Decimal("0"))
    currency = models.CharField(max_length=3, default="USD")
    details = models.JSONField(default=dict, blank=True)
    # Training failovers: the run (training.TrainingRun id) and the tokens of work thrown away.
    training_run_id = models.BigIntegerField(null=True, blank=True)
    tokens_lost = models.BigIntegerField(null=True, blank=True)
    # Inference failovers: the HTTP status of the failed attempt, when there was one.
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-detected_at"]
        indexes = [
            # The health check looks up the open cluster-health event of a cluster.
            models.Index(fields=["kind", "from_cluster", "recovered_at"], name="failover_open_idx"),
            # A training run's timeline lists its failovers.
            models.Index(fields=["training_run_id", "detected_at"], name="failover_run_idx"),
            # The failover lists filtered by code (?code=), newest first.
            models.Index(fields=["code", "detected_at"], name="failover_code_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} at {self.detected_at:%Y-%m-%d %H:%M:%S}: {self.reason}"
