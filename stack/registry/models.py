"""The registry: teams and their members, providers, clusters, models, deployments, workflows
and their routing-policy versions, API tokens, and the one failover log of the stack."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from stack.registry.endpoints import deployment_endpoint_problem, endpoint_list_problems, endpoint_url_problem
from stack.registry.failover_codes import FailoverCode
from stack.registry.queues import cluster_queue
from stack.registry.roles import Role

# The longest a workflow may keep its prompts for replays (Workflow.prompt_retention_days).
MAX_PROMPT_RETENTION_DAYS = 365


class Provider(models.Model):
    class Kind(models.TextChoices):
        ON_PREM = "on-prem", "On-prem"
        AWS = "aws", "AWS"
        GCP = "gcp", "Google Cloud"
        AZURE = "azure", "Azure"
        OPENAI_COMPATIBLE = "openai-compatible", "OpenAI-compatible"
        BEDROCK = "bedrock", "Amazon Bedrock"
        OTHER = "other", "Other"

    slug = models.SlugField(max_length=64, unique=True)
    display_name = models.CharField(max_length=128)
    kind = models.CharField(max_length=32, choices=Kind.choices)
    region = models.CharField(max_length=64, blank=True)
    # Where this provider's credentials may be sent (stack.registry.endpoints): its base URL and
    # these URL prefixes; a deployment's own base URL must lie under one of them. Admin-only,
    # like the credentials.
    base_url = models.URLField(blank=True, help_text="the default endpoint; receives the credentials")
    allowed_endpoints = models.JSONField(
        default=list,
        blank=True,
        help_text="other URL prefixes (scheme, host, port, path) deployments may use; they receive the credentials",
    )
    # The outbound guard (stack.registry.outbound) refuses loopback and private addresses unless
    # this is set: on-premise model servers, the demo's loopback serve_model.
    allow_private_network = models.BooleanField(
        default=False, help_text="may reach loopback and private addresses (on-premise model servers)"
    )
    # Fernet token (stack.registry.crypto); never returned by the API nor shown in a form.
    credentials_encrypted = models.TextField(blank=True, editable=False)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.display_name or self.slug

    @property
    def has_credentials(self) -> bool:
        return bool(self.credentials_encrypted)

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}
        if self.base_url and (problem := endpoint_url_problem(self.base_url)):
            errors["base_url"] = [problem]
        if not isinstance(self.allowed_endpoints, list) or len(self.allowed_endpoints) > 50:
            errors["allowed_endpoints"] = ["must be a list of at most 50 URLs"]
        elif problems := endpoint_list_problems(self.allowed_endpoints):
            errors["allowed_endpoints"] = problems
        if errors:
            raise ValidationError(errors)


class Cluster(models.Model):
    class Status(models.TextChoices):
        HEALTHY = "healthy", "Healthy"
        DEGRADED = "degraded", "Degraded"
        DOWN = "down", "Down"
        DRAINING = "draining", "Draining"

    class CapacityType(models.TextChoices):
        ON_DEMAND = "on-demand", "On-demand"
        SPOT = "spot", "Spot"

    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="clusters")
    slug = models.SlugField(max_length=64, unique=True)
    region = models.CharField(max_length=64, blank=True)
    accelerator_type = models.CharField(max_length=64, help_text="e.g. H100, A10G, cpu")
    accelerator_count = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    memory_per_node_gb = models.PositiveIntegerField(default=0)
    capacity_type = models.CharField(
        max_length=16, choices=CapacityType.choices, default=CapacityType.ON_DEMAND
    )
    capacity = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(1)], help_text="concurrent learners"
    )
    # Derived from worker heartbeats by stack.registry.services.cluster_health_check,
    # except DRAINING, which an operator sets and only an operator clears.
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DOWN)
    status_changed_at = models.DateTimeField(default=timezone.now)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # A spot cluster's interruption notice (the provider reclaims it at the deadline): the
    # cluster drains at once, its learners push and stop, and the training supervisor moves
    # them before the deadline. Cleared when an operator resumes the cluster.
    interruption_noticed_at = models.DateTimeField(null=True, blank=True)
    interruption_deadline = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["slug"]
        indexes = [
            # The health check scans clusters by status every few seconds.
            models.Index(fields=["status"], name="cluster_status_idx"),
        ]

    def __str__(self) -> str:
        return self.slug

    @property
    def queue(self) -> str:
        return cluster_queue(self.slug)

    @property
    def interrupted(self) -> bool:
        """Under a spot interruption notice (draining until an operator resumes it)."""
        return self.status == self.Status.DRAINING and self.interruption_noticed_at is not None

    @property
    def heartbeat_overdue(self) -> bool:
        """Shown as healthy/degraded but silent for longer than the down threshold.

        The status is only refreshed by beat's health check; when beat itself is
        not running, pages say so instead of showing a stale "healthy".
        """
        if self.status not in (self.Status.HEALTHY, self.Status.DEGRADED):
            return False
        if self.last_heartbeat_at is None:
            return True
        silent = (timezone.now() - self.last_heartbeat_at).total_seconds()
        return silent > settings.DOWN_AFTER_SECONDS


class WorkerHeartbeat(models.Model):
    """The last heartbeat of one worker process of a cluster."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="workers")
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "hostname"], name="uniq_worker_per_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.hostname} ({self.cluster.slug})"


class RegisteredModel(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    family = models.CharField(max_length=64, help_text="family or architecture, e.g. gpt-byte")
    parameter_count = models.BigIntegerField(default=0, validators=[MinValueValidator(0)])
    artifact_uri = models.CharField(max_length=512, blank=True, help_text="file://… or s3://…")
    # The training run that produced it, by id: a foreign key would make the registry
    # depend on training, which sits above it (see the import contracts in pyproject.toml).
    # The real foreign keys live one layer up: training.ModelVersion (registered_model, run)
    # holds each version a run registered, and TrainingRun.started_from the version a run began from.
    produced_by_run_id = models.BigIntegerField(null=True, blank=True)
    # Set when a training run registers its result (training.services); null for outside models.
    final_eval_loss = models.FloatField(null=True, blank=True)
    training_cost = models.DecimalField(max_digits=24, decimal_places=9, null=True, blank=True)
    tokenizer = models.CharField(max_length=64, default="bytes")
    context_length = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["slug"]
        verbose_name = "model"

    def __str__(self) -> str:
        return self.slug


class Deployment(models.Model):
    """A model served by a provider: remote model id or a local endpoint."""

    slug = models.SlugField(max_length=64, unique=True)
    model = models.ForeignKey(RegisteredModel, on_delete=models.PROTECT, related_name="deployments")
    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="deployments")
    provider_model_id = models.CharField(max_length=255, blank=True)
    base_url = models.URLField(blank=True)
    # A self-hosted deployment runs on one of our clusters; its cost per token
    # is that cluster's accelerator-hours over the tokens it served
    # (billing.selfhosted).
    hosting_cluster = models.ForeignKey(
        Cluster, null=True, blank=True, on_delete=models.PROTECT, related_name="hosted_deployments"
    )
    enabled = models.BooleanField(default=True)
    # What the deployment can serve (the router skips it for a request that needs more, and
    # the gateway answers 400 when no deployment of the route can): declared by the operator,
    # and limited further by what its adapter maps (inference.adapters.registry).
    supports_tools = models.BooleanField(default=True)
    supports_json_schema = models.BooleanField(default=True)
    supports_vision = models.BooleanField(default=False)
    supports_embeddings = models.BooleanField(default=False)
    max_context_tokens = models.PositiveIntegerField(
        null=True, blank=True, help_text="prompt plus max_tokens; empty: not checked"
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    def clean(self) -> None:
        # The page form and the Django admin run this; the API serializer calls the same check.
        if self.provider_id is not None:
            problem = deployment_endpoint_problem(provider=self.provider, base_url=self.base_url)
            if problem is not None:
                raise ValidationError({"base_url": problem})


class Team(models.Model):
    """A product team sharing the control panel: it owns workflows, budgets, API keys and
    training runs; clusters, providers and prices stay shared (stack.registry.teams says who
    sees what). The slug is what ledger rows and budgets name, so it never changes."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=100)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # Limits for every key of this team together, on /v1 (inference.ratelimit); empty means none.
    rpm_limit = models.PositiveIntegerField(null=True, blank=True, help_text="Requests per minute, all keys")
    tpm_limit = models.PositiveIntegerField(null=True, blank=True, help_text="Tokens per minute, all keys")
    # The limits as a platform admin last set them: the team's admins may lower rpm_limit and
    # tpm_limit under these, never raise or clear them past (stack.registry.team_services).
    rpm_cap = models.PositiveIntegerField(null=True, blank=True, editable=False)
    tpm_cap = models.PositiveIntegerField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class TeamMembership(models.Model):
    """A user's role in one team (viewer, operator, auditor or admin of that team). Global roles
    (Django groups, stack.registry.roles) hold on every team; a user with only memberships sees
    only their teams."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    # "sso" rows are rewritten from the identity provider's group claim at each login; "manual"
    # rows are kept as an admin set them.
    source = models.CharField(max_length=8, default="manual", choices=[("manual", "Manual"), ("sso", "SSO")])
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["team__slug", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="one_membership_per_team_and_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class SsoIdentity(models.Model):
    """Which identity at which OpenID provider a user is: (issuer, subject) as the ID token
    names them. Logins find their user through this row, never by username or email, so an
    account at the provider cannot take over a local account that happens to share a name."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity"
    )
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # The last login (interactive or silent re-authentication) that resynced this user from
    # the provider: the user's API keys stop working SWITCHYARD_SSO_KEY_SECONDS after it.
    synced_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="one_user_per_sso_identity")
        ]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"


class Workflow(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="workflows")
    # The team that owns it; None: a platform workflow only platform-wide roles see.
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.PROTECT, related_name="workflows")
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # Limits for every key calling this workflow together, on /v1 (inference.ratelimit); empty
    # means none. A key's own limits apply as well.
    rpm_limit = models.PositiveIntegerField(null=True, blank=True, help_text="Requests per minute, all keys")
    tpm_limit = models.PositiveIntegerField(null=True, blank=True, help_text="Tokens per minute, all keys")

    # Opt-in prompt retention for counterfactual routing (stack.decisions replays kept requests
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


class FailoverEvent(models.Model):
    """Every failover in the stack, written only by stack.registry.services.failover_event_*."""

    class Kind(models.TextChoices):
        CLUSTER_HEALTH = "cluster-health", "Cluster health"
        TRAINING = "training", "Training"
        INFERENCE = "inference", "Inference"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    # What caused it, from the shared taxonomy (stack.registry.failover_codes); `reason` is the
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


class ApiToken(models.Model):
    """A bearer token for the API; only its SHA-256 is stored. `user` is who created it (the
    roles it acts with); `team` is who it spends for (ledger rows and budgets name both)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    # A team key reaches only its team's workflows and is what the ledger charges per key; None:
    # a platform key of a platform-wide user.
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.PROTECT, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # A token listing workflows reaches only them, on /v1 and on every /api/ endpoint
    # (stack.registry.access, stack.registry.scoping); empty means every workflow its user may read.
    workflows = models.ManyToManyField(Workflow, blank=True, related_name="api_tokens")
    # Rate limits of this key on /v1 (inference.ratelimit); empty means none. Redis unreachable:
    # the key's calls are let through unless it fails closed (then 503).
    rpm_limit = models.PositiveIntegerField(null=True, blank=True, help_text="Requests per minute")
    tpm_limit = models.PositiveIntegerField(null=True, blank=True, help_text="Tokens per minute")
    rate_limit_fail_closed = models.BooleanField(default=False)
    # After this instant (aware UTC) the key answers 401 on /api and /v1; empty: it never expires.
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def expired(self, at: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= at

    def state_at(self, at: datetime) -> str:
        """What lists show: "revoked", "expired" (it answers 401 as a revoked one) or "active"."""
        if self.revoked_at is not None:
            return "revoked"
        return "expired" if self.expired(at) else "active"
