"""Budgets: spend limits per scope and period, their periods and the alerts they raised."""

from __future__ import annotations

from decimal import Decimal
from typing import ClassVar

from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from registry.models import (
    ApiToken,
    Cluster,
    Provider,
    Workflow,
)


class Budget(models.Model):
    class Scope(models.TextChoices):
        WORKFLOW = "workflow", "Workflow"
        PROVIDER = "provider", "Provider"
        CLUSTER = "cluster", "Cluster"
        TEAM = "team", "Team"
        TRAINING_RUN = "training_run", "Training run"
        API_KEY = "api_key", "API key"

    class Period(models.TextChoices):
        DAILY = "daily", "Daily"
        MONTHLY = "monthly", "Monthly"
        WEEKLY = "weekly", "Weekly"
        CUSTOM = "custom", "Custom"

    # The field naming what a budget covers, per scope; a budget leaves the others empty.
    SCOPE_FIELDS: ClassVar[dict[str, str]] = {
        Scope.WORKFLOW: "workflow",
        Scope.PROVIDER: "provider",
        Scope.CLUSTER: "cluster",
        Scope.TEAM: "team",
        Scope.TRAINING_RUN: "training_run_id",
        Scope.API_KEY: "api_key",
    }

    name = models.CharField(max_length=100, unique=True)
    scope = models.CharField(max_length=16, choices=Scope.choices)
    workflow = models.ForeignKey(
        Workflow, null=True, blank=True, on_delete=models.CASCADE, related_name="budgets"
    )
    provider = models.ForeignKey(
        Provider, null=True, blank=True, on_delete=models.CASCADE, related_name="budgets"
    )
    cluster = models.ForeignKey(
        Cluster, null=True, blank=True, on_delete=models.CASCADE, related_name="budgets"
    )
    team = models.CharField(max_length=64, blank=True)
    training_run_id = models.CharField(max_length=64, blank=True)
    api_key = models.ForeignKey(
        ApiToken, null=True, blank=True, on_delete=models.CASCADE, related_name="budgets"
    )
    period = models.CharField(max_length=16, choices=Period.choices, default=Period.MONTHLY)
    custom_start = models.DateTimeField(null=True, blank=True)
    custom_end = models.DateTimeField(null=True, blank=True)
    limit_amount = models.DecimalField(
        max_digits=24, decimal_places=9, validators=[MinValueValidator(Decimal("0"))]
    )
    currency = models.CharField(max_length=3, default="USD")
    thresholds = models.JSONField(default=list, blank=True, help_text="percentages, e.g. [50, 80, 100]")
    hard_limit = models.BooleanField(default=False, help_text="refuse new spending once the limit is reached")
    email_to = models.CharField(max_length=500, blank=True, help_text="comma-separated addresses")
    webhook_url = models.URLField(blank=True)
    # Fernet token (registry.crypto); the HMAC key for webhook signatures, write-only.
    webhook_secret_encrypted = models.TextField(blank=True, editable=False)
    active = models.BooleanField(default=True)
    # Made or last changed by a platform-wide writer: a team's operators may then lower its
    # limit only (billing.budgets.writes.budget_save), never raise, disable, soften or delete it.
    platform_set = models.BooleanField(default=False, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @classmethod
    def scope_attname(cls, scope: str) -> str:
        """The attribute holding a scope's target: a foreign key's id ("workflow_id"), else the text."""
        name = cls.SCOPE_FIELDS[scope]
        return f"{name}_id" if cls._meta.get_field(name).is_relation else name

    @staticmethod
    def key_for(scope: str, target: object) -> tuple[str, str]:
        """The key budgets and spends are matched on: (scope, the target's id or text, as text)."""
        return str(scope), str(target)

    def target_key(self) -> tuple[str, str]:
        """This budget's key; billing.budgets.SpendTarget.keys() of a spend it covers holds the same."""
        return self.key_for(self.scope, getattr(self, self.scope_attname(self.scope)))

    def target_label(self) -> str:
        """The scope and its target as people name them: "Workflow chat-prod" (slugs, not ids)."""
        target = getattr(self, self.SCOPE_FIELDS[self.scope])
        return f"{self.get_scope_display()} {getattr(target, 'slug', target) or ''}"


class BudgetPeriod(models.Model):
    """A budget's running totals for one period; its row lock orders admissions."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="periods")
    start = models.DateTimeField()
    end = models.DateTimeField()
    spent = models.DecimalField(max_digits=28, decimal_places=9, default=Decimal("0"))
    reserved = models.DecimalField(max_digits=28, decimal_places=9, default=Decimal("0"))

    class Meta:
        ordering = ["budget", "-start"]
        constraints = [models.UniqueConstraint(fields=["budget", "start"], name="uniq_budget_period")]

    def __str__(self) -> str:
        return f"{self.budget} {self.start:%Y-%m-%d}: {self.spent}"


class BudgetAlert(models.Model):
    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alerts")
    period_start = models.DateTimeField()
    threshold_percent = models.PositiveIntegerField()
    spent = models.DecimalField(max_digits=28, decimal_places=9)
    limit_amount = models.DecimalField(max_digits=24, decimal_places=9)
    triggered_at = models.DateTimeField()
    email_sent_at = models.DateTimeField(null=True, blank=True)
    webhook_sent_at = models.DateTimeField(null=True, blank=True)
    webhook_status = models.CharField(max_length=200, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-triggered_at"]
        constraints = [
            # One alert per threshold per period, however often the check runs.
            models.UniqueConstraint(
                fields=["budget", "period_start", "threshold_percent"], name="uniq_budget_alert"
            )
        ]

    def __str__(self) -> str:
        return f"{self.budget} reached {self.threshold_percent}%"
