"""Counterfactual routing: a workflow's kept requests replayed through candidate deployments.

ReplayStudy     one question: "what would each candidate have cost and scored on this
                workflow's recent traffic?". It samples up to `sample_size` live RetainedPrompt
                rows of the workflow (only a workflow that opted in has any), replays them
                through every candidate off the request path and scores the answers.
ReplayCandidate one deployment of the study: its replay batch job (inference.BatchJob pinned to
                the deployment: billed, rate-limited and budget-checked like any batch) and the
                figures computed from its results, each with its 95% confidence half-width.
ReplayResult    one kept request replayed on one candidate: the replayed InferenceRequest (its
                ledger rows are the evidence for the cost), the score and the latency. The
                prompt itself is never copied here: `retained_prompt` points at the kept row and
                goes NULL when that row expires.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from inference.models import BatchJob, EvalCase, InferenceRequest, RetainedPrompt
from registry.models import ApiToken, Deployment, RoutingPolicyVersion, Workflow

MAX_REPLAY_SAMPLE = 5000


class ReplayStudy(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    workflow = models.ForeignKey(Workflow, on_delete=models.PROTECT, related_name="replay_studies")
    # The policy version live when the study was made, and its primary: the baseline every
    # candidate is compared with (a recommendation is stale once the policy moved on).
    policy_version = models.ForeignKey(
        RoutingPolicyVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    baseline_deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    sample_size = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_REPLAY_SAMPLE)]
    )
    # Only requests kept at or after this instant are sampled (None: every live kept request).
    sampled_since = models.DateTimeField(null=True, blank=True)
    # How answers are scored: an inference.quality.scorers scorer against the kept answer as the
    # reference (exact, contains, regex, json_schema, numeric), or a judge deployment.
    scorer = models.CharField(max_length=16, choices=EvalCase.Scorer.choices, default=EvalCase.Scorer.JUDGE)
    scorer_config = models.JSONField(default=dict, blank=True)
    judge_deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # Replay pacing per candidate (requests per minute), below the workflow's own limits.
    max_rpm = models.PositiveIntegerField(null=True, blank=True)
    # The kept requests the study sampled (InferenceRequest ids), fixed when it starts, so every
    # candidate answers the same requests.
    sampled_request_ids = models.JSONField(default=list, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The API key it was asked for with: its budgets apply to every replayed call.
    api_key = models.ForeignKey(ApiToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Added by the replay service (decisions 0002): the runner's heartbeat (renewed as it goes;
    # a running study whose heartbeat and batch leases are stale is resumed by beat).
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # A workflow's studies, newest first (its page and the recommendation sweep).
            models.Index(fields=["workflow", "-created_at"], name="replay_study_wf_idx"),
        ]

    def __str__(self) -> str:
        return f"replay study {self.pk} of {self.workflow_id} ({self.state})"


class ReplayCandidate(models.Model):
    """One candidate deployment of a study, and what its replay measured (NULL until measured)."""

    study = models.ForeignKey(ReplayStudy, on_delete=models.CASCADE, related_name="candidates")
    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="+")
    batch_job = models.OneToOneField(
        BatchJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="replay_candidate"
    )
    requests = models.PositiveIntegerField(default=0, help_text="kept requests replayed")
    succeeded = models.PositiveIntegerField(default=0)
    # Money from the ledger rows of the replayed requests (Decimal, `currency`).
    cost_total = models.DecimalField(max_digits=24, decimal_places=9, default=Decimal("0"))
    currency = models.CharField(max_length=3, default="USD")
    cost_per_request = models.DecimalField(max_digits=24, decimal_places=9, null=True, blank=True)
    cost_per_request_ci = models.DecimalField(max_digits=24, decimal_places=9, null=True, blank=True)
    cost_per_1m_requests = models.DecimalField(max_digits=24, decimal_places=6, null=True, blank=True)
    quality_mean = models.DecimalField(max_digits=6, decimal_places=4, null=True, blank=True)
    quality_ci = models.DecimalField(max_digits=6, decimal_places=4, null=True, blank=True)
    latency_p50_ms = models.FloatField(null=True, blank=True)
    latency_p95_ms = models.FloatField(null=True, blank=True)
    latency_p95_ci_ms = models.FloatField(null=True, blank=True)
    # Added by the replay service (decisions 0002). What the judge's calls cost (ledger rows of
    # the judge requests): the price of measuring, kept apart from the candidate's own cost.
    judge_cost_total = models.DecimalField(max_digits=24, decimal_places=9, default=Decimal("0"))
    # Paired with the baseline deployment on the same kept requests (NULL for the baseline
    # itself or without one): candidate minus baseline, mean and 95% half-width.
    paired_requests = models.PositiveIntegerField(default=0)
    cost_delta_per_request = models.DecimalField(max_digits=24, decimal_places=9, null=True, blank=True)
    cost_delta_ci = models.DecimalField(max_digits=24, decimal_places=9, null=True, blank=True)
    quality_delta = models.DecimalField(max_digits=6, decimal_places=4, null=True, blank=True)
    quality_delta_ci = models.DecimalField(max_digits=6, decimal_places=4, null=True, blank=True)

    class Meta:
        ordering = ["study", "id"]
        constraints = [
            models.UniqueConstraint(fields=["study", "deployment"], name="uniq_replay_candidate"),
        ]

    def __str__(self) -> str:
        return f"study {self.study_id}: {self.deployment_id}"


class ReplayResult(models.Model):
    """One kept request replayed on one candidate."""

    candidate = models.ForeignKey(ReplayCandidate, on_delete=models.CASCADE, related_name="results")
    # The kept request (NULL once it expired; the original request row stays).
    retained_prompt = models.ForeignKey(
        RetainedPrompt, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    original_request = models.ForeignKey(InferenceRequest, on_delete=models.PROTECT, related_name="+")
    # The replayed call, recorded and billed like any batch line (NULL when it was refused).
    replay_request = models.ForeignKey(
        InferenceRequest, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    ok = models.BooleanField(default=False)
    score = models.DecimalField(
        max_digits=5,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0")), MaxValueValidator(Decimal("1"))],
    )
    cost = models.DecimalField(max_digits=24, decimal_places=9, default=Decimal("0"))
    latency_ms = models.FloatField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # Added by the replay service (decisions 0002): the judge's call, when the study's scorer is
    # the judge (billed; its ledger rows are `judge_cost`).
    judge_request = models.ForeignKey(
        InferenceRequest, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    judge_cost = models.DecimalField(max_digits=24, decimal_places=9, default=Decimal("0"))

    class Meta:
        ordering = ["candidate", "id"]
        constraints = [
            models.UniqueConstraint(fields=["candidate", "original_request"], name="uniq_replay_result"),
        ]

    def __str__(self) -> str:
        return f"candidate {self.candidate_id}: request {self.original_request_id}"
