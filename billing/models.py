"""Price books and the append-only usage ledger."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, ClassVar, NoReturn

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from stack.registry.models import (
    ApiToken,
    Cluster,
    Deployment,
    ImmutableRowError,
    Provider,
    RegisteredModel,
    Team,
    Workflow,
)

# The ledger partition writers append to unless told otherwise: its own hash chain, head row
# and rollup watermark. Migrations keep the literal "main": they are history and never change.
LEDGER_PARTITION = "main"


class Unit(models.TextChoices):
    ACCELERATOR_HOUR = "accelerator_hour", "accelerator-hour"
    INPUT_TOKENS_1M = "input_tokens_1m", "1M input tokens"
    OUTPUT_TOKENS_1M = "output_tokens_1m", "1M output tokens"
    CACHED_INPUT_TOKENS_1M = "cached_input_tokens_1m", "1M cached input tokens"
    REASONING_TOKENS_1M = "reasoning_tokens_1m", "1M reasoning tokens"
    REQUEST = "request", "request"
    STORAGE_GB_MONTH = "storage_gb_month", "GB-month of storage"
    EGRESS_GB = "egress_gb", "GB of egress"


class PriceSource(models.TextChoices):
    MANUAL = "manual", "Manual"
    CSV = "csv", "CSV import"
    CATALOG = "catalog", "Provider catalog file"


class PriceBook(models.Model):
    """One version of one price: for a cluster, a deployment or a whole provider.

    Prices are never edited in place once used: a new version with a later
    effective_from supersedes the old one, and every usage record keeps a
    reference to the version that priced it.
    """

    provider = models.ForeignKey(
        Provider, null=True, blank=True, on_delete=models.PROTECT, related_name="prices"
    )
    cluster = models.ForeignKey(
        Cluster, null=True, blank=True, on_delete=models.PROTECT, related_name="prices"
    )
    deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.PROTECT, related_name="prices"
    )
    unit = models.CharField(max_length=32, choices=Unit.choices)
    unit_price = models.DecimalField(
        max_digits=24, decimal_places=9, validators=[MinValueValidator(Decimal("0"))]
    )
    currency = models.CharField(max_length=3, default="USD")
    effective_from = models.DateTimeField(default=timezone.now)
    # Optional end (a contract that stops); a later version supersedes anyway.
    effective_to = models.DateTimeField(null=True, blank=True)
    source = models.CharField(max_length=16, choices=PriceSource.choices, default=PriceSource.MANUAL)
    version = models.PositiveIntegerField(default=1)
    note = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["-effective_from"]
        constraints = [
            models.CheckConstraint(
                name="price_has_one_target",
                condition=(
                    models.Q(cluster__isnull=False, deployment__isnull=True)
                    | models.Q(cluster__isnull=True, deployment__isnull=False)
                    | models.Q(cluster__isnull=True, deployment__isnull=True, provider__isnull=False)
                ),
            ),
        ]
        indexes = [
            # billing.selectors.price_in_force: newest version of (target, unit) at a time.
            models.Index(fields=["cluster", "unit", "-effective_from"], name="price_cluster_idx"),
            models.Index(fields=["deployment", "unit", "-effective_from"], name="price_deploy_idx"),
        ]

    def __str__(self) -> str:
        target = self.cluster or self.deployment or self.provider
        return f"{target} {self.unit} v{self.version}: {self.unit_price} {self.currency}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        # A version that priced usage is history: it can only be superseded.
        if not self._state.adding and UsageRecord.objects.filter(price_book_id=self.pk).exists():
            raise ImmutableRowError(f"price {self} has priced usage; publish a new version instead")
        super().save(*args, **kwargs)


class LedgerHead(models.Model):
    """The end of a ledger hash chain. Its row lock serialises appends to the chain."""

    partition = models.CharField(max_length=32, primary_key=True)
    last_sequence = models.BigIntegerField(default=0)
    last_hash = models.CharField(max_length=64, default="0" * 64)

    def __str__(self) -> str:
        return f"ledger {self.partition} @ {self.last_sequence}"


class AppendOnlyQuerySet(models.QuerySet["UsageRecord"]):
    def update(self, **kwargs: Any) -> NoReturn:
        raise ImmutableRowError("the usage ledger is append-only; write a reversal instead")

    def delete(self) -> NoReturn:  # type: ignore[override]
        raise ImmutableRowError("the usage ledger is append-only; write a reversal instead")


class UsageRecord(models.Model):
    """One priced unit of work. Written only by billing.services.usage_record_batch (usage_record: one row)."""

    occurred_at = models.DateTimeField()
    recorded_at = models.DateTimeField(default=timezone.now, editable=False)
    subject_type = models.CharField(max_length=32, help_text="probe_job, training_run, …")
    subject_id = models.CharField(max_length=64)
    description = models.CharField(max_length=200, blank=True)
    provider = models.ForeignKey(Provider, null=True, on_delete=models.PROTECT, related_name="+")
    cluster = models.ForeignKey(Cluster, null=True, on_delete=models.PROTECT, related_name="+")
    deployment = models.ForeignKey(Deployment, null=True, on_delete=models.PROTECT, related_name="+")
    model = models.ForeignKey(RegisteredModel, null=True, on_delete=models.PROTECT, related_name="+")
    workflow = models.ForeignKey(Workflow, null=True, on_delete=models.PROTECT, related_name="+")
    team = models.CharField(max_length=64, blank=True)
    # The API key whose request caused the spend (gateway, batch job, eval run); None for work no
    # key asked for (training, probes). No database constraint and nothing done on delete: an
    # append-only row keeps the id it was written with, whatever happens to the key later.
    api_key = models.ForeignKey(
        ApiToken, null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    quantity = models.DecimalField(max_digits=24, decimal_places=9)
    unit = models.CharField(max_length=32, choices=Unit.choices)
    unit_price = models.DecimalField(max_digits=24, decimal_places=9)
    amount = models.DecimalField(max_digits=24, decimal_places=9)
    currency = models.CharField(max_length=3)
    price_book = models.ForeignKey(PriceBook, on_delete=models.PROTECT, related_name="usage")
    reverses = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="reversed_by"
    )
    # Lets a retried task bill the same work exactly once.
    idempotency_key = models.CharField(max_length=128, unique=True)
    # Hash chain (billing.chain): sha256 over the canonical fields and prev_hash.
    partition = models.CharField(max_length=32, default=LEDGER_PARTITION)
    sequence = models.BigIntegerField()
    prev_hash = models.CharField(max_length=64)
    row_hash = models.CharField(max_length=64)

    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        ordering = ["-occurred_at", "-id"]
        indexes = [
            # Spend per provider per day (the overview chart) scans by time.
            models.Index(fields=["occurred_at", "provider"], name="usage_time_provider_idx"),
            models.Index(fields=["subject_type", "subject_id"], name="usage_subject_idx"),
        ]
        constraints = [
            # `ledger verify` and the rollup watermark walk the chain in this order.
            models.UniqueConstraint(fields=["partition", "sequence"], name="usage_chain_position"),
        ]

    def __str__(self) -> str:
        return f"{self.subject_type}:{self.subject_id} {self.quantity} {self.unit} = {self.amount} {self.currency}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise ImmutableRowError("the usage ledger is append-only; write a reversal instead")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise ImmutableRowError("the usage ledger is append-only; write a reversal instead")


# --- Rollups -----------------------------------------------------------------------------------


class DailyRollup(models.Model):
    """Daily totals per (day, provider, cluster, deployment, model, workflow, run, team, unit, currency).

    Derived from the ledger by billing.rollups (incrementally, idempotently) so
    that dashboards never scan raw usage; `manage.py rollups rebuild` reproduces
    them exactly from the ledger.
    """

    day = models.DateField()
    provider = models.ForeignKey(Provider, null=True, on_delete=models.PROTECT, related_name="+")
    cluster = models.ForeignKey(Cluster, null=True, on_delete=models.PROTECT, related_name="+")
    deployment = models.ForeignKey(Deployment, null=True, on_delete=models.PROTECT, related_name="+")
    model = models.ForeignKey(RegisteredModel, null=True, on_delete=models.PROTECT, related_name="+")
    workflow = models.ForeignKey(Workflow, null=True, on_delete=models.PROTECT, related_name="+")
    training_run_id = models.CharField(max_length=64, blank=True)
    team = models.CharField(max_length=64, blank=True)
    api_key = models.ForeignKey(
        ApiToken, null=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    unit = models.CharField(max_length=32, choices=Unit.choices)
    currency = models.CharField(max_length=3)
    # All the dimensions above in one string: a portable unique key (NULL ids
    # would otherwise count as distinct in a unique constraint).
    dims_key = models.CharField(max_length=255, unique=True)
    quantity = models.DecimalField(max_digits=28, decimal_places=9, default=Decimal("0"))
    amount = models.DecimalField(max_digits=28, decimal_places=9, default=Decimal("0"))
    row_count = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["day"]
        indexes = [
            # Dashboard: spend per day (and provider) over a period.
            models.Index(fields=["day", "provider"], name="rollup_day_provider_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.dims_key}: {self.amount} {self.currency}"


class RollupWatermark(models.Model):
    """The last ledger sequence folded into DailyRollup, per ledger partition."""

    partition = models.CharField(max_length=32, primary_key=True)
    last_sequence = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"rollups of {self.partition} @ {self.last_sequence}"


# --- Budgets -----------------------------------------------------------------------------------


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
    # Fernet token (stack.registry.crypto); the HMAC key for webhook signatures, write-only.
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


# --- Exports -----------------------------------------------------------------------------------


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


# --- Reconciliation ------------------------------------------------------------------------------


class InvoiceImport(models.Model):
    """A provider invoice or cost report, imported to compare with the ledger."""

    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="invoice_imports")
    filename = models.CharField(max_length=255)
    uploaded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    uploaded_at = models.DateTimeField(default=timezone.now, editable=False)
    period_start = models.DateField()
    period_end = models.DateField()
    tolerance = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0.01"))
    row_count = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-uploaded_at"]

    def __str__(self) -> str:
        return f"{self.provider} {self.filename}"


class InvoiceLine(models.Model):
    invoice = models.ForeignKey(InvoiceImport, on_delete=models.CASCADE, related_name="lines")
    line_number = models.PositiveIntegerField()
    day = models.DateField()
    service = models.CharField(max_length=128)
    resource_id = models.CharField(max_length=255, blank=True)
    usage_quantity = models.DecimalField(max_digits=28, decimal_places=9, default=Decimal("0"))
    amount = models.DecimalField(max_digits=28, decimal_places=9)
    currency = models.CharField(max_length=3)
    raw = models.JSONField(default=dict)

    class Meta:
        ordering = ["invoice", "line_number"]
        indexes = [models.Index(fields=["invoice", "day", "service"], name="invoice_day_service_idx")]

    def __str__(self) -> str:
        return f"{self.invoice} line {self.line_number}"


# --- Alert channels, deliveries and spend anomalies ------------------------------------------------


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
    # Fernet token (stack.registry.crypto): Slack's and Teams' webhook URLs are their own
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
    # What the alert is about ("budget:7:2026-12-01", "anomaly:provider:3"): one incident, one key.
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
