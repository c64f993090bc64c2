"""Recommendations: a proposed change of a workflow's route, its figures and its evidence.

A recommendation is derived from a finished ReplayStudy (decisions.recommendations.services):
"switch the primary from A to B" with the cost per request before and after (summed from the
ledger rows of the replayed requests), the quality before and after with their 95% confidence
half-widths, the p95 latency change and the number of replayed requests. It stays `proposed`
until an operator accepts it (a new routing-policy version, recorded here) or dismisses it with
a reason; a newer study of the same workflow supersedes it. It is stale (refused on accept) once
the workflow's policy moved on from the version it was computed against.

Other kinds (build-or-buy's "buy instead of train") use the same row: the kind says which
figures apply, the evidence names eval runs instead of a study.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from decisions.models.replay import ReplayCandidate, ReplayStudy
from inference.models import EvalRun
from registry.models import Deployment, RoutingPolicyVersion, Workflow


class Recommendation(models.Model):
    class Kind(models.TextChoices):
        SWITCH_PRIMARY = "switch_primary", "Switch the primary deployment"
        BUY_INSTEAD_OF_TRAIN = "buy_instead_of_train", "Buy from an API instead of training"

    class State(models.TextChoices):
        PROPOSED = "proposed", "Proposed"
        ACCEPTED = "accepted", "Accepted"
        DISMISSED = "dismissed", "Dismissed"
        SUPERSEDED = "superseded", "Superseded"

    workflow = models.ForeignKey(Workflow, on_delete=models.PROTECT, related_name="recommendations")
    kind = models.CharField(max_length=32, choices=Kind.choices, default=Kind.SWITCH_PRIMARY)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PROPOSED)

    # The proposal: the route's primary moves from `from_deployment` to `to_deployment`; computed
    # against `policy_version` (the version in force when the study was made).
    from_deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    to_deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    policy_version = models.ForeignKey(
        RoutingPolicyVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    # The evidence: the study, the candidate proposed and the baseline it was compared with (the
    # replayed requests are their ReplayResults), the eval runs where a kind uses them.
    study = models.ForeignKey(
        ReplayStudy, null=True, blank=True, on_delete=models.PROTECT, related_name="recommendations"
    )
    candidate = models.ForeignKey(
        ReplayCandidate, null=True, blank=True, on_delete=models.PROTECT, related_name="recommendations"
    )
    baseline_candidate = models.ForeignKey(
        ReplayCandidate, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    eval_runs = models.ManyToManyField(EvalRun, blank=True, related_name="+")

    # The figures. Money from the ledger rows of the replayed requests (UsageRecord, subject_type
    # "inference_request"): sum and count per side, and the sum over the replayed requests.
    currency = models.CharField(max_length=3, default="USD")
    cost_per_request_before = models.DecimalField(max_digits=24, decimal_places=9, null=True, blank=True)
    cost_per_request_after = models.DecimalField(max_digits=24, decimal_places=9, null=True, blank=True)
    cost_change_percent = models.DecimalField(max_digits=9, decimal_places=1, null=True, blank=True)
    ledger_amount_before = models.DecimalField(max_digits=24, decimal_places=9, null=True, blank=True)
    ledger_amount_after = models.DecimalField(max_digits=24, decimal_places=9, null=True, blank=True)
    ledger_rows_before = models.PositiveIntegerField(default=0)
    ledger_rows_after = models.PositiveIntegerField(default=0)
    replayed_requests_before = models.PositiveIntegerField(default=0)
    replayed_requests = models.PositiveIntegerField(
        default=0, help_text="replayed on the proposed deployment"
    )
    quality_before = models.DecimalField(max_digits=6, decimal_places=4, null=True, blank=True)
    quality_before_ci = models.DecimalField(max_digits=6, decimal_places=4, null=True, blank=True)
    quality_after = models.DecimalField(max_digits=6, decimal_places=4, null=True, blank=True)
    quality_after_ci = models.DecimalField(max_digits=6, decimal_places=4, null=True, blank=True)
    # after - before, and the 95% half-width of that difference (paired over the same requests
    # where both sides scored them): the non-inferiority rule reads these.
    quality_diff = models.DecimalField(max_digits=6, decimal_places=4, null=True, blank=True)
    quality_diff_ci = models.DecimalField(max_digits=6, decimal_places=4, null=True, blank=True)
    latency_p95_before_ms = models.FloatField(null=True, blank=True)
    latency_p95_after_ms = models.FloatField(null=True, blank=True)
    latency_p95_delta_ms = models.FloatField(null=True, blank=True)
    # Each budget the new primary's spend falls under: limit, spend projected to the period's end
    # at the workflow's recent volume, and whether it fits (strings: JSON holds no Decimal).
    budget_checks = models.JSONField(default=list, blank=True)
    summary = models.CharField(max_length=300)

    # The decision.
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    dismiss_reason = models.CharField(max_length=500, blank=True)
    accepted_policy_version = models.OneToOneField(
        RoutingPolicyVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="recommendation"
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # One proposal per (study, candidate, kind): deriving twice finds the first one.
            models.UniqueConstraint(
                fields=["study", "candidate", "kind"],
                condition=models.Q(candidate__isnull=False),
                name="uniq_recommendation_candidate",
            ),
            models.CheckConstraint(
                condition=~models.Q(state="dismissed") | ~models.Q(dismiss_reason=""),
                name="recommendation_dismissed_has_reason",
            ),
            models.CheckConstraint(
                condition=~models.Q(state="accepted") | models.Q(accepted_policy_version__isnull=False),
                name="recommendation_accepted_has_version",
            ),
        ]
        indexes = [
            # The list page and the supersede sweep: a workflow's proposals, newest first.
            models.Index(fields=["workflow", "state", "-created_at"], name="recommendation_wf_state_idx"),
        ]

    def __str__(self) -> str:
        return f"recommendation {self.pk} ({self.workflow_id}, {self.state})"
