"""Writes of the inference app: the request recorder (the one writer of InferenceRequest and
InferenceAttempt rows, and of the UsageRecords and FailoverEvents they cause), quality records,
chaos settings."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from typing import TYPE_CHECKING

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from billing.models import Unit
from billing.services import AMOUNT_QUANTUM, UsageInput, usage_record_batch
from inference.breaker import breakers
from inference.models import ChaosConfig, EvalCase, EvalRun, InferenceAttempt, InferenceRequest, QualityRecord
from stack.models import Deployment, FailoverEvent, Workflow
from stack.services import RegistryError, failover_event_record

if TYPE_CHECKING:
    from inference.router import AttemptInfo
    from inference.selectors import PlanEntry, RoutePlan

MILLION = Decimal(1_000_000)
DEMOTION_EVENT_TTL_S = 600.0  # one quality-demotion event per workflow and deployment per 10 min
Outcome = InferenceAttempt.Outcome


def _q(value: Decimal) -> Decimal:
    return value.quantize(AMOUNT_QUANTUM, rounding=ROUND_HALF_EVEN)


def _billable_units(a: AttemptInfo) -> list[tuple[str, Decimal, Decimal]]:
    """(unit, quantity, unit price) per billed unit of an attempt; unpriced units are not billed."""
    out = []
    entry = a.entry
    if a.tokens_in and entry.input_price is not None:
        out.append((Unit.INPUT_TOKENS_1M.value, Decimal(a.tokens_in) / MILLION, entry.input_price))
    if a.tokens_out and entry.output_price is not None:
        out.append((Unit.OUTPUT_TOKENS_1M.value, Decimal(a.tokens_out) / MILLION, entry.output_price))
    return out


def inference_request_record(
    *,
    workflow: Workflow,
    plan: RoutePlan,
    attempts: Sequence[AttemptInfo],
    endpoint: str,
    stream: bool,
    winner: PlanEntry | None,
    latency_ms: float,
    ttft_ms: float | None,
    error: str,
    client_request_id: str | None = None,
    response_text: str = "",
    demoted: Sequence[tuple[PlanEntry, float]] = (),
) -> InferenceRequest:
    """Record one routed request in one transaction: the request, its attempts, a UsageRecord per
    billed unit of each attempt that returned tokens (priced by the ledger, idempotent keys
    `inference:<request>:<attempt>:<unit>`), a FailoverEvent per failed call that led to another
    call, and a quality-demotion event the first time a deployment is skipped for quality.

    The request's cost is the sum of its ledger rows' amounts, so the ledger total equals the
    sum of request costs exactly.
    """
    now = timezone.now()
    answered = next((a for a in reversed(attempts) if a.outcome == Outcome.OK), None)
    billed = {a.position: _billable_units(a) for a in attempts if a.outcome == Outcome.OK}
    # The ledger prices each row itself; this prediction (same prices, same rounding) lets the
    # request row be written once, and is corrected below in the rare case a price changed.
    predicted = {
        pos: sum((_q(_q(qty) * price) for _, qty, price in units), Decimal(0))
        for pos, units in billed.items()
    }
    total = sum(predicted.values(), Decimal(0))
    currency = winner.currency if winner is not None else "USD"
    with transaction.atomic():
        row = InferenceRequest.objects.create(
            workflow=workflow,
            policy_version_id=plan.policy_id,
            deployment=winner.deployment if winner is not None else None,
            status=InferenceRequest.Status.SUCCEEDED
            if winner is not None
            else InferenceRequest.Status.FAILED,
            endpoint=endpoint,
            stream=stream,
            tokens_in=answered.tokens_in if answered else 0,
            tokens_out=answered.tokens_out if answered else 0,
            latency_ms=latency_ms,
            ttft_ms=ttft_ms,
            cost=total,
            currency=currency,
            attempts=len(attempts),
            error=error[:4000],
            client_request_id=client_request_id or None,
            response_text=response_text,
            created_at=now,
        )
        items = [
            UsageInput(
                unit=unit,
                quantity=qty,
                occurred_at=now,
                idempotency_key=f"inference:{row.pk}:{pos}:{'in' if unit == Unit.INPUT_TOKENS_1M else 'out'}",
                subject_type="inference_request",
                subject_id=str(row.pk),
                deployment=attempts_by_pos.entry.deployment,
                workflow=workflow,
                description=f"{workflow.slug} via {attempts_by_pos.entry.deployment.slug}",
            )
            for pos, units in billed.items()
            for attempts_by_pos in [next(a for a in attempts if a.position == pos)]
            for unit, qty, _ in units
        ]
        costs: dict[int, Decimal] = {}
        if items:
            for record in usage_record_batch(items=items):
                pos = int(record.idempotency_key.split(":")[2])
                costs[pos] = costs.get(pos, Decimal(0)) + record.amount
            actual = sum(costs.values(), Decimal(0))
            if actual != total:
                InferenceRequest.objects.filter(pk=row.pk).update(cost=actual)
                row.cost = actual
        for a in attempts:
            a.cost = costs.get(a.position, Decimal(0))
        InferenceAttempt.objects.bulk_create(
            [
                InferenceAttempt(
                    request=row,
                    position=a.position,
                    deployment=a.entry.deployment,
                    status_code=a.status_code,
                    outcome=a.outcome,
                    latency_ms=a.latency_ms,
                    tokens_in=a.tokens_in,
                    tokens_out=a.tokens_out,
                    cost=a.cost,
                    error=a.error,
                )
                for a in attempts
            ]
        )
        called = [a for a in attempts if a.called]
        for failed, following in zip(called, called[1:], strict=False):
            if failed.outcome == Outcome.OK:
                continue
            failover_event_record(
                kind=FailoverEvent.Kind.INFERENCE,
                reason=f"{failed.deployment_slug} → {following.deployment_slug}: {failed.error}",
                detected_at=now,
                from_deployment=failed.entry.deployment,
                to_deployment=following.entry.deployment,
                subject=f"inference-request:{row.pk}",
                time_lost=timedelta(milliseconds=max(following.started_at - failed.started_at, 0) * 1000.0),
                extra_cost=failed.cost,
                currency=currency,
                status_code=failed.status_code,
                details={
                    "workflow": workflow.slug,
                    "policy_version": plan.version,
                    "outcome": failed.outcome,
                },
            )
        for entry, score in demoted:
            if breakers().claim_once(
                f"demoted:{workflow.pk}:{entry.deployment.pk}", ttl_s=DEMOTION_EVENT_TTL_S
            ):
                failover_event_record(
                    kind=FailoverEvent.Kind.INFERENCE,
                    reason=(
                        f"quality demotion: {entry.deployment.slug} rolling score {score:.3f} "
                        f"below the floor {plan.quality_floor:.3f} of {workflow.slug}"
                    ),
                    detected_at=now,
                    from_deployment=entry.deployment,
                    to_deployment=winner.deployment if winner is not None else None,
                    subject=f"workflow:{workflow.slug}",
                    details={
                        "workflow": workflow.slug,
                        "score": score,
                        "floor": plan.quality_floor,
                        "demotion": True,
                    },
                )
    return row


# --- Quality -----------------------------------------------------------------------------------


def quality_record_create(
    *,
    deployment: Deployment,
    score: Decimal | float,
    source: str,
    workflow: Workflow | None = None,
    eval_run: EvalRun | None = None,
    eval_case: EvalCase | None = None,
    inference_request: InferenceRequest | None = None,
    comment: str = "",
) -> QualityRecord:
    """The only writer of QualityRecord rows. Score in [0, 1]; the router sees it within seconds."""
    from inference.selectors import rolling_caches_clear

    try:
        value = Decimal(str(score)).quantize(Decimal("0.0001"), rounding=ROUND_HALF_EVEN)
    except ArithmeticError:
        raise RegistryError("score must be a number between 0 and 1", field="score") from None
    if not Decimal(0) <= value <= Decimal(1):
        raise RegistryError("score must be between 0 and 1", field="score")
    if source not in QualityRecord.Source.values:
        raise RegistryError(f"source must be one of {', '.join(QualityRecord.Source.values)}", field="source")
    record = QualityRecord.objects.create(
        deployment=deployment,
        workflow=workflow,
        source=source,
        score=value,
        eval_run=eval_run,
        eval_case=eval_case,
        inference_request=inference_request,
        comment=comment[:500],
    )
    rolling_caches_clear()
    return record


# --- Chaos drills ----------------------------------------------------------------------------------


def chaos_config_set(
    *,
    deployment: Deployment,
    enabled: bool,
    user: User | None,
    error_rate: float = 0.0,
    status_codes: Sequence[int] = (),
    latency_ms: int = 0,
    malformed_rate: float = 0.0,
) -> ChaosConfig:
    """Switch fault injection for a deployment on or off; the next routed request sees it."""
    for name, rate in (("error_rate", error_rate), ("malformed_rate", malformed_rate)):
        if not 0.0 <= float(rate) <= 1.0:
            raise RegistryError("a rate is between 0 and 1", field=name)
    codes = [int(c) for c in status_codes]
    if any(not 100 <= c <= 599 for c in codes):
        raise RegistryError("status codes are HTTP codes (100-599)", field="status_codes")
    if latency_ms < 0:
        raise RegistryError("latency cannot be negative", field="latency_ms")
    config, _ = ChaosConfig.objects.update_or_create(
        deployment=deployment,
        defaults={
            "enabled": enabled,
            "error_rate": float(error_rate),
            "status_codes": codes,
            "latency_ms": int(latency_ms),
            "malformed_rate": float(malformed_rate),
            "updated_at": timezone.now(),
            "updated_by": user,
        },
    )
    return config
