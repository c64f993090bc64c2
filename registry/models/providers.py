"""Providers, the clusters they or we run, worker heartbeats, registered models and the
deployments that serve them."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from registry.queues import cluster_queue


class Provider(models.Model):
    class Kind(models.TextChoices):
        ON_PREM = "on-prem", "On-prem"
        AWS = "aws", "AWS"
        GCP = "gcp", "Google Cloud"
        AZURE = "azure", "Azure"
        OPENAI_COMPATIBLE = "openai-compatible", "OpenAI-compatible"
        BEDROCK = "bedrock", "Amazon Bedrock"
        ANTHROPIC = "anthropic", "Anthropic (Messages API)"
        OTHER = "other", "Other"

    slug = models.SlugField(max_length=64, unique=True)
    display_name = models.CharField(max_length=128)
    kind = models.CharField(max_length=32, choices=Kind.choices)
    region = models.CharField(max_length=64, blank=True)
    # Where this provider's credentials may be sent (registry.outbound.endpoints): its base URL and
    # these URL prefixes; a deployment's own base URL must lie under one of them. Admin-only,
    # like the credentials.
    base_url = models.URLField(blank=True, help_text="the default endpoint; receives the credentials")
    allowed_endpoints = models.JSONField(
        default=list,
        blank=True,
        help_text="other URL prefixes (scheme, host, port, path) deployments may use; they receive the credentials",
    )
    # The outbound guard (registry.outbound.guard) refuses loopback and private addresses unless
    # this is set: on-premise model servers, the demo's loopback serve_model.
    allow_private_network = models.BooleanField(
        default=False, help_text="may reach loopback and private addresses (on-premise model servers)"
    )
    # Fernet token (registry.crypto); never returned by the API nor shown in a form.
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
    # Derived from worker heartbeats by registry.services.cluster_health_check,
    # except DRAINING, which an operator sets and only an operator clears.
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DOWN)
    status_changed_at = models.DateTimeField(default=timezone.now)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # A spot cluster's interruption notice (the provider reclaims it at the deadline): the
    # cluster drains at once, its learners push and stop, and the training supervisor moves
    # them before the deadline. Cleared when an operator resumes the cluster.
    interruption_noticed_at = models.DateTimeField(null=True, blank=True)
    interruption_deadline = models.DateTimeField(null=True, blank=True)
    # The cluster's own object store (registry.store.cluster_stores): its learners' checkpoints
    # live there instead of in the installation's store (OBJECT_STORE_URL), and what crosses
    # between the two is measured and billed as the cluster's egress. Blank: the installation's.
    object_store_url = models.CharField(
        max_length=500,
        blank=True,
        help_text="s3://bucket[/prefix] or file:///dir under CLUSTER_STORE_FILE_ROOT; blank: the installation's store",
    )
    object_store_endpoint_url = models.URLField(
        blank=True,
        help_text="the S3 endpoint of the cluster's store (blank: AWS, or the installation's endpoint)",
    )
    # Fernet token (registry.crypto) of "ACCESS_KEY_ID:SECRET_ACCESS_KEY"; never returned or shown.
    object_store_credentials_encrypted = models.TextField(blank=True, editable=False)
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
    def has_object_store_credentials(self) -> bool:
        return bool(self.object_store_credentials_encrypted)

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
    # The accelerators the worker offers its chunks, as device ordinals its processes see
    # (registry.worker_signals); [] on a CPU worker. A chunk owns some of them while it runs
    # (training.services.chunks), so two learners on one worker never share a device.
    devices = models.JSONField(default=list, blank=True)

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
    # OpenAI-compatible deployments only: the endpoint serves OpenAI's Responses API
    # (`/responses`), so a /v1/responses request is sent to it as written, not as chat.
    speaks_responses = models.BooleanField(
        default=False, help_text="serves OpenAI's /responses: Responses requests go to it as written"
    )
    max_context_tokens = models.PositiveIntegerField(
        null=True, blank=True, help_text="prompt plus max_tokens; empty: not checked"
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug
