"""Alert channels, their deliveries, and the spend anomalies they announce."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class AlertKind(models.TextChoices):
    BUDGET = "budget", "Budget threshold"
    ANOMALY = "anomaly", "Spend anomaly"
    DIGEST = "digest", "Daily spend digest"


class AlertChannel(models.Model):
    """Where alerts go besides a budget's own email and webhook: a signed generic webhook, a Slack
    incoming webhook or a Microsoft Teams webhook (billing.alerts)."""

    class Kind(models.TextChoices):
        WEBHOOK = "webhook", "Signed webhook (JSON, HMAC-SHA256)"
        SLACK = "slack", "Slack incoming webhook"
        TEAMS = "teams", "Microsoft Teams webhook (Adaptive Card)"

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    # Fernet token (registry.crypto): Slack's and Teams' webhook URLs are their own
    # credential, so the URL is write-only like a secret; pages show `url_host` only.
    url_encrypted = models.TextField(editable=False)
    url_host = models.CharField(max_length=255, editable=False)
    # Fernet token: the HMAC key of a signed webhook (kind webhook only), write-only.
    secret_encrypted = models.TextField(blank=True, editable=False)
    budget_alerts = models.BooleanField(default=True)
    anomaly_alerts = models.BooleanField(default=True)
    daily_digest = models.BooleanField(default=False)
    digest_team = models.CharField(
        max_length=64,
        blank=True,
        help_text="the ledger team whose digest this channel gets; empty: every team's",
    )
    quiet_period_seconds = models.PositiveIntegerField(
        default=3600, help_text="after an alert, repeats about the same subject are held back this long"
    )
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class AlertDelivery(models.Model):
    """One alert to one channel: sent once (claimed under a row lock), or held back as a repeat."""

    channel = models.ForeignKey(AlertChannel, on_delete=models.CASCADE, related_name="deliveries")
    kind = models.CharField(max_length=16, choices=AlertKind.choices)
    # What the alert is about ("budget:7:2026-12-01:80", "anomaly:provider:3"): one incident, one key.
    dedup_key = models.CharField(max_length=200)
    # {"title", "text", "facts": [[label, value], ...], "link"}: formatted per channel when sent.
    message = models.JSONField(default=dict)
    created_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=200, blank=True)
    # Repeats of the same key within the channel's quiet period, folded into this delivery.
    repeats = models.PositiveIntegerField(default=0)
    last_repeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # The quiet-period check: the channel's latest delivery with this key.
            models.Index(fields=["channel", "dedup_key", "created_at"], name="alert_delivery_dedup_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.dedup_key} → {self.channel}"


class SpendAnomaly(models.Model):
    """A day whose spend rate on one provider, workflow or cluster left its robust baseline
    (billing.alerts.anomalies); the figures that made it fire are kept to show why."""

    class Dimension(models.TextChoices):
        PROVIDER = "provider", "Provider"
        WORKFLOW = "workflow", "Workflow"
        CLUSTER = "cluster", "Cluster"

    dimension = models.CharField(max_length=16, choices=Dimension.choices)
    target_id = models.BigIntegerField()
    target_label = models.CharField(max_length=128)
    day = models.DateField()
    currency = models.CharField(max_length=3)
    spent_so_far = models.DecimalField(max_digits=28, decimal_places=9)
    # Today's spend projected to a full day (what is compared with the baseline).
    rate = models.DecimalField(max_digits=28, decimal_places=9)
    median = models.DecimalField(max_digits=28, decimal_places=9)
    mad = models.DecimalField(max_digits=28, decimal_places=9)
    threshold = models.DecimalField(max_digits=28, decimal_places=9)
    baseline = models.JSONField(default=list, help_text="[[day, total], ...] of the trailing days")
    detected_at = models.DateTimeField()

    class Meta:
        ordering = ["-detected_at", "-id"]
        constraints = [
            # One anomaly per target, day and currency, however often the detector runs.
            models.UniqueConstraint(
                fields=["dimension", "target_id", "day", "currency"], name="uniq_spend_anomaly"
            )
        ]

    def __str__(self) -> str:
        return f"{self.dimension} {self.target_label} {self.day}: {self.rate} > {self.threshold}"
