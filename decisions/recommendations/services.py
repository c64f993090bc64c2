"""Recommendations, the decisions: accept one in one click (the workflow's new policy version,
its reason naming the evidence) or dismiss it with a reason. Deriving them from a finished replay
study is decisions.recommendations.derive; accepting refuses (409) a proposal whose workflow's
policy version has moved on since its study."""

from __future__ import annotations

import logging

from django.contrib.auth.models import User
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from decisions.models import Recommendation
from registry.errors import DomainError
from registry.models import Workflow
from registry.selectors import workflow_current_policy
from registry.services import workflow_policy_change

logger = logging.getLogger(__name__)

REASON_MAX = 500  # RoutingPolicyVersion.reason


class RecommendationError(DomainError):
    """A refused decision (400 with field messages in the API, a form error on the page)."""


class RecommendationConflict(RecommendationError):
    """The recommendation was decided already, or its workflow's route moved on (409)."""

    status_code = 409


# --- Deriving -----------------------------------------------------------------------------------


def recommendation_url(*, recommendation: Recommendation) -> str:
    """The evidence page (a path: the reason is read on this deployment's own pages)."""
    return reverse("decisions:recommendation", args=[recommendation.pk])


def recommendation_reason(*, recommendation: Recommendation) -> str:
    """The new policy version's reason: the recommendation, its summary and its evidence URL
    (the summary is shortened, never the URL, to fit the reason's 500 characters)."""
    head = f"recommendation #{recommendation.pk}: "
    tail = f" \u2014 evidence {recommendation_url(recommendation=recommendation)}"
    room = REASON_MAX - len(head) - len(tail)
    summary = recommendation.summary
    if len(summary) > room:
        summary = summary[: max(room - 1, 0)] + "\u2026"
    return head + summary + tail


def _locked_proposal(recommendation_id: int) -> Recommendation:
    try:
        row = (
            Recommendation.objects.select_for_update(of=("self",))
            .select_related("workflow", "to_deployment", "policy_version")
            .get(pk=recommendation_id)
        )
    except Recommendation.DoesNotExist:
        raise RecommendationError("no such recommendation") from None
    if row.state != Recommendation.State.PROPOSED:
        raise RecommendationConflict(f"this recommendation is {row.get_state_display().lower()} already")
    return row


def recommendation_accept(*, recommendation_id: int, user: User) -> Recommendation:
    """Write the proposed route as the workflow's next policy version and record it here.

    The candidate goes first and the rest of the current route keeps its order, weights,
    strategy, quality floor and cost limit. Refused (409) once decided, or when the workflow's
    policy version is no longer the one the proposal was computed against."""
    now = timezone.now()
    with transaction.atomic():
        rec = _locked_proposal(recommendation_id)
        if rec.kind != Recommendation.Kind.SWITCH_PRIMARY or rec.to_deployment is None:
            raise RecommendationConflict("only a switch of the primary deployment is accepted in one click")
        # The lock workflow_policy_change takes, taken first: no change slips in between the
        # staleness check and the new version.
        Workflow.objects.select_for_update().filter(pk=rec.workflow_id).first()
        current = workflow_current_policy(workflow=rec.workflow)
        if current is None or current.pk != rec.policy_version_id:
            raise RecommendationConflict(
                "stale: the workflow's route changed since this recommendation was computed "
                f"(v{rec.policy_version.version if rec.policy_version else '?'} then, "
                f"v{current.version if current else '?'} now); run a new replay study"
            )
        target = rec.to_deployment
        if not target.enabled:
            raise RecommendationConflict(f"deployment {target.slug} is disabled")
        entries = list(current.entries.select_related("deployment").order_by("position"))
        if entries and entries[0].deployment_id == target.pk:
            raise RecommendationConflict(f"{target.slug} is the primary deployment already")
        weight = {e.deployment_id: e.weight for e in entries}
        # The candidate takes the weight the old primary had when it was not in the route.
        first_weight = weight.get(target.pk, entries[0].weight if entries else 1)
        rest = [e for e in entries if e.deployment_id != target.pk]
        policy = workflow_policy_change(
            workflow=rec.workflow,
            deployments=[target, *(e.deployment for e in rest)],
            weights=[first_weight, *(e.weight for e in rest)],
            author=user,
            reason=recommendation_reason(recommendation=rec),
            strategy=current.strategy,
            quality_floor=current.quality_floor,
            max_cost_per_request=current.max_cost_per_request,
        )
        rec.state = Recommendation.State.ACCEPTED
        rec.decided_by = user
        rec.decided_at = now
        rec.accepted_policy_version = policy
        rec.save(update_fields=["state", "decided_by", "decided_at", "accepted_policy_version"])
    logger.info("recommendation %s accepted by %s: %s", rec.pk, user.get_username(), policy)
    return rec


def recommendation_dismiss(*, recommendation_id: int, user: User, reason: str) -> Recommendation:
    """Close the proposal without changing the route; the reason is required."""
    reason = (reason or "").strip()
    if not reason:
        raise RecommendationError("say why the recommendation is dismissed", field="reason")
    if len(reason) > REASON_MAX:
        raise RecommendationError(f"at most {REASON_MAX} characters", field="reason")
    with transaction.atomic():
        rec = _locked_proposal(recommendation_id)
        rec.state = Recommendation.State.DISMISSED
        rec.dismiss_reason = reason
        rec.decided_by = user
        rec.decided_at = timezone.now()
        rec.save(update_fields=["state", "dismiss_reason", "decided_by", "decided_at"])
    return rec
