"""Workflows and their versioned routing policies (append-only versions and their entries)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from registry.models.providers import Deployment
from registry.models.teams import Team

# The longest a workflow may keep its prompts for replays (Workflow.prompt_retention_days).
MAX_PROMPT_RETENTION_DAYS = 365


class Workflow(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="workflows")
    # The team that owns it; None: a platform workflow only platform-wide roles see.
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.PROTECT, related_name="workflows")
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # Limits for every key calling this workflow together, on /v1 (inference.ratelimit.limits); empty
    # means none. A key's own limits apply as well.
    rpm_limit = models.PositiveIntegerField(null=True, blank=True, help_text="Requests per minute, all keys")
    tpm_limit = models.PositiveIntegerField(null=True, blank=True, help_text="Tokens per minute, all keys")

    # Opt-in prompt retention for counterfactual routing (decisions replays kept requests
    # through candidate deployments). Off: no prompt or answer of this workflow's gateway traffic
    # is stored anywhere. On: each request's input and answer are kept as an
    # inference.RetainedPrompt for `prompt_retention_days`, then deleted by beat.
    retain_prompts = models.BooleanField(
        default=False, help_text="Keep gateway prompts and answers for replays (opt-in)"
    )
    prompt_retention_days = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_PROMPT_RETENTION_DAYS)],
        help_text="Days a kept prompt lives (required when prompts are kept)",
    )

    # The response cache (inference.cache), opt-in: an exact repeat of a request (same API, body,
    # route version) is answered from the cache for this many seconds (0: off), at most
    # `response_cache_entries` answers per workflow. Never longer than kept prompts live.
    response_cache_seconds = models.PositiveIntegerField(
        default=0, help_text="Seconds a cached answer is served (0: no cache)"
    )
    response_cache_entries = models.PositiveIntegerField(
        default=1000, help_text="Most answers cached for this workflow"
    )
    # Semantic matching (inference.cache.semantic), opt-in on top of the response cache: a
    # request whose prompt's embedding (from `semantic_cache_deployment`, an embeddings
    # deployment, billed as its own request) is at least this cosine similarity to a cached
    # prompt's, with every other field equal, is answered with that prompt's answer. It stores an
    # embedding of each prompt, so it needs prompts kept (retain_prompts); null: exact match only.
    semantic_cache_threshold = models.DecimalField(
        max_digits=5,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0.5")), MaxValueValidator(Decimal("1"))],
        help_text="Cosine similarity from which a cached answer serves another prompt (empty: exact only)",
    )
    semantic_cache_deployment = models.ForeignKey(
        Deployment,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The embeddings deployment that embeds prompts for semantic matching",
    )

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(retain_prompts=False)
                | models.Q(
                    prompt_retention_days__gte=1, prompt_retention_days__lte=MAX_PROMPT_RETENTION_DAYS
                ),
                name="workflow_retention_days_when_kept",
            ),
            models.CheckConstraint(
                condition=models.Q(semantic_cache_threshold__isnull=True)
                | models.Q(semantic_cache_deployment__isnull=False, retain_prompts=True),
                name="workflow_semantic_cache_needs_embedder_and_kept_prompts",
            ),
        ]

    def __str__(self) -> str:
        return self.slug

    @property
    def team_slug(self) -> str:
        """The owning team's slug, as ledger rows and team budgets name it ("" for none)."""
        return self.team.slug if self.team is not None else ""


class ImmutableRowError(Exception):
    """Raised when code tries to change a row that is append-only."""


class RoutingPolicyVersion(models.Model):
    """One immutable version of a workflow's route; the newest one is in force."""

    class Strategy(models.TextChoices):
        PRIORITY = "priority", "Priority (ordered fallbacks)"
        CHEAPEST = "cheapest", "Cheapest above the quality floor"
        FASTEST = "fastest", "Fastest (rolling p50)"
        WEIGHTED = "weighted", "Weighted split"

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="policy_versions")
    version = models.PositiveIntegerField()
    strategy = models.CharField(max_length=16, choices=Strategy.choices, default=Strategy.PRIORITY)
    quality_floor = models.DecimalField(max_digits=6, decimal_places=4, null=True, blank=True)
    max_cost_per_request = models.DecimalField(max_digits=20, decimal_places=9, null=True, blank=True)
    deployments: models.ManyToManyField[Deployment, RoutingPolicyEntry] = models.ManyToManyField(
        Deployment, through="RoutingPolicyEntry", related_name="policy_versions"
    )
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="policy_versions"
    )
    reason = models.CharField(max_length=500)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["workflow", "-version"]
        constraints = [models.UniqueConstraint(fields=["workflow", "version"], name="uniq_policy_version")]

    def __str__(self) -> str:
        return f"{self.workflow.slug} v{self.version}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise ImmutableRowError("routing policy versions are immutable; create a new version")
        super().save(*args, **kwargs)

    def ordered_deployments(self) -> list[Deployment]:
        return [e.deployment for e in self.entries.select_related("deployment").order_by("position")]


class RoutingPolicyEntry(models.Model):
    policy = models.ForeignKey(RoutingPolicyVersion, on_delete=models.CASCADE, related_name="entries")
    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="+")
    position = models.PositiveIntegerField()
    weight = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["policy", "position"]
        constraints = [
            models.UniqueConstraint(fields=["policy", "position"], name="uniq_policy_position"),
            models.UniqueConstraint(fields=["policy", "deployment"], name="uniq_policy_deployment"),
        ]

    def __str__(self) -> str:
        return f"{self.policy} #{self.position}: {self.deployment.slug}"
