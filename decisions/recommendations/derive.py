"""Recommendations, derived from a finished replay study (accepting and dismissing them is
decisions.recommendations.services).

The rule (`recommendations_from_study`): a candidate is proposed as the workflow's new primary
when, against the baseline (the study's replay of the current primary on the same requests),

1. it is cheaper per request: the ledger sum of its replayed requests over their number is
   below the baseline's, both summed from the ledger rows themselves;
2. it respects the quality floor of the policy version the study ran against: the lower bound
   of its 95% confidence interval (quality_mean - quality_ci) is at or above the floor;
3. it is not meaningfully worse than the baseline: a non-inferiority test with margin
   QUALITY_MARGIN. The 95% confidence interval of the quality difference (candidate - baseline)
   must lie above -margin, i.e. diff - half_width >= -margin. The difference is paired over the
   requests both sides scored (the same kept requests were replayed on both), which is the
   tighter and correct interval for two systems answering the same questions (Miller, "Adding
   Error Bars to Evals", arXiv 2411.00640, section 4); with fewer than two pairs the two
   candidates' own half-widths are combined in quadrature (independent samples). The margin
   framing follows the CONSORT extension for non-inferiority trials (Piaggio et al., JAMA
   2012;308(24):2594-2604): "not worse by more than the margin, with 95% confidence";
4. its spend fits the workflow's budgets: for every active budget the new primary's spend falls
   under (billing.budgets.budgets_for_target: the workflow, the deployment's provider and hosting
   cluster, the team), what the period has spent plus what it would still spend stays within
   the limit. The spend still to come is the period's burn rate over the time left, plus the
   rest of the period's requests at the workflow's recent volume times the change in cost per
   request (the whole new cost for a budget that does not count today's primary), and never
   below zero: savings cannot un-spend money. A budget already spent fits no change that
   spends more under it.

Deriving is idempotent per (study, candidate); a newer finished study of a workflow supersedes
the older proposals still open; accepting refuses (409) a proposal whose workflow's policy
version has moved on since its study.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime as datetime_t
from datetime import timedelta
from decimal import ROUND_HALF_EVEN, Decimal

from django.db import transaction
from django.utils import timezone

from billing.budgets import budget_state, budgets_for_target, spend_target
from decisions.models import Recommendation, ReplayCandidate, ReplayResult, ReplayStudy
from decisions.recommendations.selectors import LedgerCost, replay_ledger_cost
from inference.models import InferenceRequest
from registry.models import Deployment, RoutingPolicyVersion, Workflow
from registry.selectors import workflow_current_policy

logger = logging.getLogger(__name__)
MINUS = "\u2212"

# Non-inferiority margin on the 0..1 quality scale: a candidate may be at most this much worse
# than the baseline (at 95% confidence) to be proposed.
QUALITY_MARGIN = Decimal("0.02")
# The workflow's recent volume: live requests (those routed by a policy version; replays, eval
# and judge calls pin a deployment and have none) over this window.
VOLUME_WINDOW = timedelta(days=7)
ZERO = Decimal(0)
Z95 = Decimal("1.96")  # two-sided 95%, normal approximation
QUALITY_PLACES = Decimal("0.0001")


class LedgerPending(Exception):
    """Some replayed requests' ledger rows are still in the request journal (folded within
    seconds: inference.recording.journal); derive again once they are in the ledger."""


@dataclass(frozen=True)
class QualityDiff:
    diff: Decimal
    half_width: Decimal
    pairs: int


def _scores(candidate: ReplayCandidate) -> dict[int, Decimal]:
    rows = ReplayResult.objects.filter(candidate=candidate, score__isnull=False).values_list(
        "original_request_id", "score"
    )
    return {req: score for req, score in rows if score is not None}


def quality_difference(*, baseline: ReplayCandidate, candidate: ReplayCandidate) -> QualityDiff | None:
    """candidate - baseline quality with its 95% half-width: paired over the requests both scored
    (mean of the differences, 1.96 * sd / sqrt(n)); from the two means and their half-widths in
    quadrature when fewer than two requests were scored on both."""
    before, after = _scores(baseline), _scores(candidate)
    common = sorted(set(before) & set(after))
    if len(common) >= 2:
        diffs = [after[r] - before[r] for r in common]
        n = Decimal(len(diffs))
        mean = sum(diffs, Decimal("0")) / n
        variance = sum(((d - mean) ** 2 for d in diffs), Decimal("0")) / (n - 1)  # sample variance
        half = Z95 * variance.sqrt() / n.sqrt()
        return QualityDiff(mean.quantize(QUALITY_PLACES), half.quantize(QUALITY_PLACES), len(common))
    a_mean, a_ci, b_mean, b_ci = (
        candidate.quality_mean,
        candidate.quality_ci,
        baseline.quality_mean,
        baseline.quality_ci,
    )
    if a_mean is None or a_ci is None or b_mean is None or b_ci is None:
        return None
    diff = a_mean - b_mean
    half = (a_ci**2 + b_ci**2).sqrt()
    return QualityDiff(diff.quantize(QUALITY_PLACES), half.quantize(QUALITY_PLACES), 0)


def workflow_recent_volume(*, workflow: Workflow, now: datetime_t, window: timedelta = VOLUME_WINDOW) -> int:
    """Live requests of the workflow in the last `window` (each routed by a policy version)."""
    return InferenceRequest.objects.filter(
        workflow=workflow, policy_version__isnull=False, created_at__gte=now - window, created_at__lt=now
    ).count()


def _money(value: Decimal) -> str:
    return str(value.quantize(Decimal("0.000001"), rounding=ROUND_HALF_EVEN))


def budget_checks(
    *,
    workflow: Workflow,
    baseline: Deployment,
    candidate: Deployment,
    before: Decimal,
    after: Decimal,
    currency: str,
    now: datetime_t,
) -> list[dict[str, object]]:
    """Each budget the new primary's spend would count against, with the projected spend at the
    period's end and whether it fits (see the module docstring, rule 4)."""
    volume = workflow_recent_volume(workflow=workflow, now=now)
    per_second = Decimal(volume) / Decimal(int(VOLUME_WINDOW.total_seconds()))
    new_target = spend_target(
        workflow=workflow, provider=candidate.provider, cluster=candidate.hosting_cluster
    )
    old_keys = set(
        spend_target(workflow=workflow, provider=baseline.provider, cluster=baseline.hosting_cluster).keys()
    )
    checks: list[dict[str, object]] = []
    for budget in budgets_for_target(target=new_target):
        if budget.currency != currency:
            continue  # another currency's budget counts none of these rows
        state = budget_state(budget=budget, now=now)
        if state is None:
            continue  # outside its custom period
        remaining = Decimal(int(max(state.end - now, timedelta(0)).total_seconds()))
        future_requests = per_second * remaining
        delta = after - before if budget.target_key() in old_keys else after
        # What is spent stays spent: savings on future requests lower only the spend still to
        # come, never below nothing. A budget already spent fits only a change that spends
        # nothing more under it.
        to_come = max(state.spend_to_come(now=now) + future_requests * delta, ZERO)
        projected = state.spent + to_come
        fits = projected <= budget.limit_amount and (state.spent < budget.limit_amount or to_come <= 0)
        checks.append(
            {
                "budget": budget.pk,
                "name": budget.name,
                "limit": _money(budget.limit_amount),
                "spent": _money(state.spent),
                "projected": _money(projected),
                "period_end": state.end.isoformat(),
                "fits": fits,
            }
        )
    return checks


def _signed_percent(value: Decimal) -> str:
    rounded = value.quantize(Decimal("1"), rounding=ROUND_HALF_EVEN)
    if rounded < 0:
        return f"{MINUS}{-rounded}%"
    return f"+{rounded}%"


def recommendation_summary(
    *,
    workflow: Workflow,
    from_deployment: Deployment,
    to_deployment: Deployment,
    cost_change_percent: Decimal,
    quality_before: Decimal | None,
    quality_after: Decimal | None,
    quality_after_ci: Decimal | None,
    latency_p95_delta_ms: float | None,
    replayed_requests: int,
) -> str:
    """ "switch support-triage's primary from A to B: -38% cost per request, quality 0.91 -> 0.90
    (95% CI +-0.02), p95 +40 ms, from 500 replayed requests" (no money figure: viewers read it)."""
    parts = [f"{_signed_percent(cost_change_percent)} cost per request"]
    if quality_before is not None and quality_after is not None:
        ci = f" (95% CI \u00b1{quality_after_ci:.2f})" if quality_after_ci is not None else ""
        parts.append(f"quality {quality_before:.2f} \u2192 {quality_after:.2f}{ci}")
    if latency_p95_delta_ms is not None:
        delta = round(latency_p95_delta_ms)
        parts.append(f"p95 {'+' if delta >= 0 else MINUS}{abs(delta)} ms")
    parts.append(f"from {replayed_requests} replayed requests")
    return (
        f"switch {workflow.slug}'s primary from {from_deployment.slug} to {to_deployment.slug}: "
        + ", ".join(parts)
    )


@dataclass(frozen=True)
class Verdict:
    """Why a candidate was or was not proposed (logged; the tests read it)."""

    candidate_id: int
    proposed: bool
    reason: str


def _percent_change(before: Decimal, after: Decimal) -> Decimal:
    return ((after - before) * Decimal(100) / before).quantize(Decimal("0.1"), rounding=ROUND_HALF_EVEN)


def _judge(
    *,
    study: ReplayStudy,
    policy: RoutingPolicyVersion,
    baseline: ReplayCandidate,
    base_cost: LedgerCost,
    candidate: ReplayCandidate,
    now: datetime_t,
    quality_margin: Decimal,
) -> tuple[Verdict, dict[str, object] | None]:
    """Apply the four rules to one candidate; the fields of its recommendation when proposed."""

    def no(reason: str) -> tuple[Verdict, None]:
        return Verdict(candidate.pk, False, reason), None

    cost = replay_ledger_cost(candidate=candidate)
    if cost.requests == 0 or cost.per_request is None:
        return no("no replayed requests")
    if cost.pending:
        return no("ledger rows still pending")
    if cost.currencies and cost.currency != base_cost.currency:
        return no("priced in another currency than the baseline")
    if base_cost.per_request is None or cost.per_request >= base_cost.per_request:
        return no("not cheaper per request")
    if candidate.quality_mean is None:
        return no("not scored")
    lower = candidate.quality_mean - (candidate.quality_ci or Decimal("0"))
    if policy.quality_floor is not None and lower < policy.quality_floor:
        return no(f"quality CI lower bound {lower} below the floor {policy.quality_floor}")
    diff = quality_difference(baseline=baseline, candidate=candidate)
    if diff is None:
        return no("quality difference unknown")
    if diff.diff - diff.half_width < -quality_margin:
        return no(
            f"quality worse than the baseline: {diff.diff} \u00b1 {diff.half_width} (margin {quality_margin})"
        )
    currency = base_cost.currency or candidate.currency
    checks = budget_checks(
        workflow=study.workflow,
        baseline=baseline.deployment,
        candidate=candidate.deployment,
        before=base_cost.per_request,
        after=cost.per_request,
        currency=currency,
        now=now,
    )
    over = [c["name"] for c in checks if not c["fits"]]
    if over:
        return no(f"over budget: {', '.join(str(n) for n in over)}")
    percent = _percent_change(base_cost.per_request, cost.per_request)
    latency_delta = (
        candidate.latency_p95_ms - baseline.latency_p95_ms
        if candidate.latency_p95_ms is not None and baseline.latency_p95_ms is not None
        else None
    )
    fields: dict[str, object] = {
        "workflow": study.workflow,
        "from_deployment": baseline.deployment,
        "to_deployment": candidate.deployment,
        "policy_version": policy,
        "baseline_candidate": baseline,
        "currency": currency,
        "cost_per_request_before": base_cost.per_request,
        "cost_per_request_after": cost.per_request,
        "cost_change_percent": percent,
        "ledger_amount_before": base_cost.amount,
        "ledger_amount_after": cost.amount,
        "ledger_rows_before": base_cost.rows,
        "ledger_rows_after": cost.rows,
        "replayed_requests_before": base_cost.requests,
        "replayed_requests": cost.requests,
        "quality_before": baseline.quality_mean,
        "quality_before_ci": baseline.quality_ci,
        "quality_after": candidate.quality_mean,
        "quality_after_ci": candidate.quality_ci,
        "quality_diff": diff.diff,
        "quality_diff_ci": diff.half_width,
        "latency_p95_before_ms": baseline.latency_p95_ms,
        "latency_p95_after_ms": candidate.latency_p95_ms,
        "latency_p95_delta_ms": latency_delta,
        "budget_checks": checks,
        "summary": recommendation_summary(
            workflow=study.workflow,
            from_deployment=baseline.deployment,
            to_deployment=candidate.deployment,
            cost_change_percent=percent,
            quality_before=baseline.quality_mean,
            quality_after=candidate.quality_mean,
            quality_after_ci=candidate.quality_ci,
            latency_p95_delta_ms=latency_delta,
            replayed_requests=cost.requests,
        ),
    }
    return Verdict(candidate.pk, True, "cheaper, within the floor, not worse, within budget"), fields


@dataclass(frozen=True)
class Derivation:
    recommendations: list[Recommendation]  # proposed by this study (new or found again)
    verdicts: list[Verdict]
    superseded: int  # older proposals of the workflow this study superseded


def recommendations_from_study(
    *, study_id: int, quality_margin: Decimal = QUALITY_MARGIN, now: datetime_t | None = None
) -> Derivation:
    """Derive the switch-primary proposals of a finished study (module docstring: the rule).

    Idempotent: a second call finds the proposals of the first (one per study and candidate).
    A study that is not SUCCEEDED, whose baseline was not replayed, whose policy version is no
    longer the workflow's current one, or that a newer finished study of the workflow already
    answered proposes nothing. Raises LedgerPending while a replayed
    request's ledger rows are still journaled (the task retries)."""
    now = now or timezone.now()
    study = ReplayStudy.objects.select_related("workflow", "policy_version", "baseline_deployment").get(
        pk=study_id
    )
    if study.state != ReplayStudy.State.SUCCEEDED:
        return Derivation([], [], 0)
    candidates = list(study.candidates.select_related("deployment__provider", "deployment__hosting_cluster"))
    baseline = next((c for c in candidates if c.deployment_id == study.baseline_deployment_id), None)
    policy = workflow_current_policy(workflow=study.workflow)
    pending = InferenceRequest.objects.filter(
        pk__in=ReplayResult.objects.filter(candidate__study=study).values("replay_request_id"),
        ledger_pending__isnull=False,
    ).count()
    if pending:
        # The money comes from the ledger rows: none is judged on a partial sum.
        raise LedgerPending(f"study {study.pk}: {pending} replayed requests not in the ledger yet")
    verdicts: list[Verdict] = []
    proposals: list[Recommendation] = []
    with transaction.atomic():
        # One derivation per workflow at a time: the supersede sweep and the proposals agree.
        Workflow.objects.select_for_update().filter(pk=study.workflow_id).first()
        newer = ReplayStudy.objects.filter(
            workflow_id=study.workflow_id, state=ReplayStudy.State.SUCCEEDED, created_at__gt=study.created_at
        ).exists()
        if newer:
            # An older study that finished late: the newer one's verdict stands.
            logger.info("study %s: a newer study of the workflow finished; nothing proposed", study.pk)
            return Derivation([], [], 0)
        superseded = _supersede_older(study=study)
        if baseline is None or policy is None or study.policy_version_id != policy.pk:
            logger.info("study %s: no baseline replay or its policy moved on; nothing proposed", study.pk)
            return Derivation([], [], superseded)
        base_cost = replay_ledger_cost(candidate=baseline)
        if base_cost.per_request is None or len(base_cost.currencies) > 1:
            logger.info("study %s: the baseline's ledger cost is not complete; nothing proposed", study.pk)
            return Derivation([], [], superseded)
        for candidate in candidates:
            if candidate.pk == baseline.pk:
                continue
            existing = Recommendation.objects.filter(
                study=study, candidate=candidate, kind=Recommendation.Kind.SWITCH_PRIMARY
            ).first()
            if existing is not None:
                proposals.append(existing)
                verdicts.append(Verdict(candidate.pk, True, "proposed already"))
                continue
            verdict, fields = _judge(
                study=study,
                policy=policy,
                baseline=baseline,
                base_cost=base_cost,
                candidate=candidate,
                now=now,
                quality_margin=quality_margin,
            )
            verdicts.append(verdict)
            logger.info("study %s candidate %s: %s", study.pk, candidate.pk, verdict.reason)
            if fields is not None:
                proposals.append(
                    Recommendation.objects.create(
                        kind=Recommendation.Kind.SWITCH_PRIMARY,
                        study=study,
                        candidate=candidate,
                        created_at=now,
                        **fields,  # type: ignore[arg-type]
                    )
                )
    return Derivation(proposals, verdicts, superseded)


def _supersede_older(*, study: ReplayStudy) -> int:
    """Older studies' open proposals for the workflow give way to this (newer) study's verdict.
    Saved one by one so that the audit trail records each change of state."""
    older = Recommendation.objects.filter(
        workflow_id=study.workflow_id,
        kind=Recommendation.Kind.SWITCH_PRIMARY,
        state=Recommendation.State.PROPOSED,
        study__created_at__lt=study.created_at,
    ).exclude(study=study)
    count = 0
    for row in older.select_for_update():
        row.state = Recommendation.State.SUPERSEDED
        row.save(update_fields=["state"])
        count += 1
    return count
