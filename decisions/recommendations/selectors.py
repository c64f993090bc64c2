"""Reads for recommendations: which a caller may see, and their money recomputed from the ledger.

The cost figures of a recommendation are never taken on trust: `replay_ledger_cost` sums the
ledger rows (billing.UsageRecord, subject_type "inference_request") of a candidate's replayed
requests, and `recommendation_reconcile` recomputes a stored recommendation's figures the same
way, so a page can show that they still agree with the ledger to the last digit.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Count, OuterRef, QuerySet, Subquery, Sum
from django.http import Http404

from billing.models import UsageRecord
from decisions.models import Recommendation, ReplayCandidate, ReplayResult
from inference.models import InferenceRequest
from registry.models import RoutingPolicyVersion, Workflow
from registry.selectors import workflow_current_policy, workflows_visible

SUBJECT_TYPE = "inference_request"  # the ledger's subject of a routed request (inference.recording)
COST_PLACES = Decimal("0.000000001")  # the ledger's nine decimal places
ZERO = Decimal("0")


def cost_per_request(amount: Decimal, requests: int) -> Decimal | None:
    """The ledger sum over the requests, per request, at the ledger's precision."""
    if requests <= 0:
        return None
    return (amount / requests).quantize(COST_PLACES, rounding=ROUND_HALF_EVEN)


@dataclass(frozen=True)
class LedgerCost:
    """The ledger rows of a set of replayed requests: their count, sum and currencies."""

    request_ids: tuple[int, ...]
    rows: int
    amount: Decimal
    currencies: tuple[str, ...]
    pending: int  # requests whose ledger rows are still in the journal (not folded yet)

    @property
    def requests(self) -> int:
        return len(self.request_ids)

    @property
    def per_request(self) -> Decimal | None:
        return cost_per_request(self.amount, self.requests)

    @property
    def currency(self) -> str:
        return self.currencies[0] if len(self.currencies) == 1 else ""


def replay_request_ids(*, candidate: ReplayCandidate) -> tuple[int, ...]:
    """The requests a candidate's replay made (a refused line made none)."""
    ids = (
        ReplayResult.objects.filter(candidate=candidate, replay_request__isnull=False)
        .order_by("replay_request_id")
        .values_list("replay_request_id", flat=True)
    )
    return tuple(i for i in ids if i is not None)


def ledger_cost_of_requests(*, request_ids: tuple[int, ...]) -> LedgerCost:
    """Sum and count of the ledger rows of these requests (reversals included, as the ledger has them)."""
    rows = UsageRecord.objects.filter(subject_type=SUBJECT_TYPE, subject_id__in=[str(i) for i in request_ids])
    totals = rows.aggregate(rows=Count("id"), amount=Sum("amount"))
    currencies = tuple(sorted(set(rows.values_list("currency", flat=True).distinct())))
    pending = InferenceRequest.objects.filter(pk__in=request_ids, ledger_pending__isnull=False).count()
    return LedgerCost(
        request_ids=request_ids,
        rows=totals["rows"] or 0,
        amount=totals["amount"] if totals["amount"] is not None else ZERO,
        currencies=currencies,
        pending=pending,
    )


def replay_ledger_cost(*, candidate: ReplayCandidate) -> LedgerCost:
    """What a candidate's replay cost, from the ledger."""
    return ledger_cost_of_requests(request_ids=replay_request_ids(candidate=candidate))


@dataclass(frozen=True)
class Reconciliation:
    """A recommendation's stored money figures beside the same figures recomputed from the ledger."""

    before: LedgerCost | None
    after: LedgerCost | None
    stored: dict[str, Any]
    recomputed: dict[str, Any]

    @property
    def matches(self) -> bool:
        return self.stored == self.recomputed


def _money_figures(before: LedgerCost | None, after: LedgerCost | None) -> dict[str, Any]:
    return {
        "ledger_rows_before": before.rows if before else 0,
        "ledger_amount_before": before.amount if before else None,
        "replayed_requests_before": before.requests if before else 0,
        "cost_per_request_before": before.per_request if before else None,
        "ledger_rows_after": after.rows if after else 0,
        "ledger_amount_after": after.amount if after else None,
        "replayed_requests": after.requests if after else 0,
        "cost_per_request_after": after.per_request if after else None,
    }


def recommendation_reconcile(*, recommendation: Recommendation) -> Reconciliation:
    """Recompute the recommendation's money from the ledger rows of its replayed requests."""
    before = (
        replay_ledger_cost(candidate=recommendation.baseline_candidate)
        if recommendation.baseline_candidate is not None
        else None
    )
    after = (
        replay_ledger_cost(candidate=recommendation.candidate)
        if recommendation.candidate is not None
        else None
    )
    stored = {name: getattr(recommendation, name) for name in _money_figures(None, None)}
    return Reconciliation(before, after, stored, _money_figures(before, after))


def recommendation_stale(*, recommendation: Recommendation) -> bool:
    """Has the workflow's policy moved on from the version the proposal was computed against?
    (Read from `current_policy_id` when the queryset annotated it: one query for a whole list.)"""
    if hasattr(recommendation, "current_policy_id"):
        current_id = recommendation.current_policy_id
    else:
        current = workflow_current_policy(workflow=recommendation.workflow)
        current_id = current.pk if current is not None else None
    return current_id is None or current_id != recommendation.policy_version_id


def with_current_policy(rows: QuerySet[Recommendation]) -> QuerySet[Recommendation]:
    """`rows` annotated with their workflow's current policy version id (`current_policy_id`)."""
    newest = RoutingPolicyVersion.objects.filter(workflow=OuterRef("workflow")).order_by("-version")
    return rows.annotate(current_policy_id=Subquery(newest.values("pk")[:1]))


def recommendations_visible(
    *, user: User | AnonymousUser, teams: frozenset[int] | None = None, state: str | None = None
) -> QuerySet[Recommendation]:
    """The recommendations of the workflows `user` may see (only those of `teams` when given: a
    page's ?team= pick), newest first, with `current_policy_id` for the staleness check."""
    workflows: QuerySet[Workflow] = workflows_visible(user=user)
    if teams is not None:
        workflows = workflows.filter(team__in=teams)
    rows = with_current_policy(
        Recommendation.objects.filter(workflow__in=workflows).select_related(
            "workflow", "from_deployment", "to_deployment", "policy_version", "decided_by", "study"
        )
    )
    if state:
        rows = rows.filter(state=state)
    return rows


def get_recommendation_for_user(*, pk: int, user: User | AnonymousUser) -> Recommendation:
    """The recommendation if `user` may see its workflow; 404 otherwise, as for one that does not exist."""
    try:
        return recommendations_visible(user=user).select_related("candidate", "baseline_candidate").get(pk=pk)
    except Recommendation.DoesNotExist:
        raise Http404("no such recommendation") from None
