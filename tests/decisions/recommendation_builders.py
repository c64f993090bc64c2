"""A finished replay study built as the replay machinery leaves one: live requests of a workflow
routed by its policy, each replayed through every candidate deployment with the router (pinned
to the deployment, billed to the ledger as any call), scored, and each candidate's figures
computed from its results. The scores are given (no judge here); everything else is real."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

from django.contrib.auth.models import User
from django.utils import timezone

from decisions.models import ReplayCandidate, ReplayResult, ReplayStudy
from inference.adapters.base import ChatMessage, ChatRequest
from inference.router.entry import route
from registry.models import Deployment, Workflow
from registry.selectors import workflow_current_policy
from tests.helpers import ledger_settled

Z95 = Decimal("1.96")


@dataclass(frozen=True)
class Side:
    """One deployment replayed in the study, with the score each replayed answer got."""

    deployment: Deployment
    scores: Sequence[Decimal]
    latency_p95_ms: float = 100.0


def _ci(scores: Sequence[Decimal]) -> tuple[Decimal, Decimal]:
    n = Decimal(len(scores))
    mean = sum(scores, Decimal("0")) / n
    var = sum(((s - mean) ** 2 for s in scores), Decimal("0")) / (n - 1)
    half = Z95 * var.sqrt() / n.sqrt()
    return mean.quantize(Decimal("0.0001")), half.quantize(Decimal("0.0001"))


def live_requests(workflow: Workflow, count: int) -> list[int]:
    """`count` live requests of the workflow, routed by its current policy (its recent volume)."""
    ids = []
    for i in range(count):
        result = route(
            workflow=workflow, request=ChatRequest(messages=(ChatMessage("user", f"question {i}"),))
        )
        assert result.ok and result.request_id is not None
        ids.append(result.request_id)
    return ids


def finished_study(
    *, workflow: Workflow, owner: User, baseline: Side, candidates: Sequence[Side], originals: Sequence[int]
) -> ReplayStudy:
    """A SUCCEEDED study of `workflow` against its current policy, `baseline` its primary."""
    policy = workflow_current_policy(workflow=workflow)
    now = timezone.now()
    study = ReplayStudy.objects.create(
        workflow=workflow,
        policy_version=policy,
        baseline_deployment=baseline.deployment,
        sample_size=len(originals),
        scorer="exact",
        sampled_request_ids=list(originals),
        state=ReplayStudy.State.RUNNING,
        created_by=owner,
        started_at=now,
    )
    for side in (baseline, *candidates):
        assert len(side.scores) == len(originals)
        candidate = ReplayCandidate.objects.create(study=study, deployment=side.deployment)
        total = Decimal("0")
        for original, score in zip(originals, side.scores, strict=True):
            result = route(
                workflow=workflow,
                request=ChatRequest(messages=(ChatMessage("user", f"replay of {original}"),)),
                deployment=side.deployment,
            )
            assert result.ok and result.request_id is not None
            total += result.cost
            ReplayResult.objects.create(
                candidate=candidate,
                original_request_id=original,
                replay_request_id=result.request_id,
                ok=True,
                score=score,
                cost=result.cost,
                latency_ms=result.latency_ms,
            )
        mean, half = _ci(side.scores)
        n = len(originals)
        candidate.requests = candidate.succeeded = n
        candidate.cost_total = total
        candidate.cost_per_request = (total / n).quantize(Decimal("0.000000001"), rounding=ROUND_HALF_EVEN)
        candidate.cost_per_1m_requests = (total / n * 1_000_000).quantize(Decimal("0.000001"))
        candidate.quality_mean, candidate.quality_ci = mean, half
        candidate.latency_p95_ms = side.latency_p95_ms
        candidate.save()
    study.state = ReplayStudy.State.SUCCEEDED
    study.finished_at = timezone.now()
    study.save(update_fields=["state", "finished_at"])
    # A finished study's requests are in the ledger (the journal folds them after the answer).
    ledger_settled()
    return study
