"""Price books and the append-only usage ledger."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, NoReturn

from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from registry.models import (
    ApiToken,
    Cluster,
    Deployment,
    ImmutableRowError,
    Provider,
    RegisteredModel,
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
    # Input tokens written to a provider's prompt cache (Anthropic's cache_creation_input_tokens),
    # which providers that sell caching price above plain input.
    CACHE_WRITE_TOKENS_1M = "cache_write_tokens_1m", "1M cache-write input tokens"
    REASONING_TOKENS_1M = "reasoning_tokens_1m", "1M reasoning tokens"
    # A batch job's tokens (inference.batch), where the provider sells them cheaper than
    # interactive ones; without such a price they are billed at the input / output price.
    BATCH_INPUT_TOKENS_1M = "batch_input_tokens_1m", "1M batch input tokens"
    BATCH_OUTPUT_TOKENS_1M = "batch_output_tokens_1m", "1M batch output tokens"
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
    # A response-cache hit's row (inference.cache): billed nothing, it records what the answer
    # cost when it was bought, the spend the cache avoided. NULL on every other row.
    cost_avoided = models.DecimalField(max_digits=24, decimal_places=9, null=True, blank=True)
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
            # The response cache's savings (the dashboard): its hit rows only.
            models.Index(
                fields=["occurred_at"],
                name="usage_cache_hit_idx",
                condition=models.Q(cost_avoided__isnull=False),
            ),
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
