"""Build or buy: each model version of a build-or-buy run served and scored, and the API
deployments it is compared with.

VersionEvaluation  one model version of a run with the `build_or_buy` option: the deployment it
                   was served as (in-process, loopback, hosted on the option's serve_cluster),
                   the hosting time billed to the run, the tokens served, and its state. Claimed
                   with a conditional UPDATE, so a redelivered task or the beat sweep never
                   scores a version twice; a claim older than the stale limit is taken over.
VersionScore       the version's eval run on one eval set of one workflow (billed to the run).
ApiScore           an API deployment of a workflow's route scored on the same eval set: the eval
                   run it reused (a recent succeeded one) or started (billed to the run).
Every money figure the panel shows is computed from these rows' eval runs and the ledger.
"""

from __future__ import annotations

from decimal import Decimal

from django.db import models
from django.utils import timezone

from inference.models import EvalRun, EvalSet
from registry.models import Deployment, Workflow
from training.models import ModelVersion, TrainingRun


class VersionEvaluation(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"

    model_version = models.OneToOneField(ModelVersion, on_delete=models.CASCADE, related_name="evaluation")
    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="version_evaluations")
    deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    claimed_at = models.DateTimeField(null=True, blank=True)
    hosting_seconds = models.DecimalField(max_digits=14, decimal_places=3, default=Decimal("0"))
    hosting_cost = models.DecimalField(max_digits=24, decimal_places=9, default=Decimal("0"))
    tokens_served = models.BigIntegerField(default=0)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "model_version__number"]
        indexes = [
            # The beat sweep: evaluations not finished (pending, or a claim gone stale).
            models.Index(fields=["state", "claimed_at"], name="version_eval_state_idx"),
        ]

    def __str__(self) -> str:
        return f"evaluation of version {self.model_version_id} ({self.state})"


class VersionScore(models.Model):
    evaluation = models.ForeignKey(VersionEvaluation, on_delete=models.CASCADE, related_name="scores")
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="+")
    eval_set = models.ForeignKey(EvalSet, on_delete=models.CASCADE, related_name="+")
    eval_run = models.OneToOneField(EvalRun, on_delete=models.PROTECT, related_name="version_score")

    class Meta:
        ordering = ["evaluation", "workflow", "eval_set"]
        constraints = [
            models.UniqueConstraint(fields=["evaluation", "eval_set"], name="uniq_version_score_set"),
        ]

    def __str__(self) -> str:
        return f"{self.evaluation_id} on {self.eval_set_id}"


class ApiScore(models.Model):
    run = models.ForeignKey(TrainingRun, on_delete=models.CASCADE, related_name="api_scores")
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="+")
    eval_set = models.ForeignKey(EvalSet, on_delete=models.CASCADE, related_name="+")
    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="+")
    eval_run = models.ForeignKey(EvalRun, on_delete=models.PROTECT, related_name="+")
    reused = models.BooleanField(default=False, help_text="a recent eval run, not one started for this run")
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["run", "workflow", "deployment"]
        constraints = [
            models.UniqueConstraint(fields=["run", "eval_set", "deployment"], name="uniq_api_score"),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id}: {self.deployment_id} on {self.eval_set_id}"
