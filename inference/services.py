"""Writes of the inference app: the request recorder (the one writer of InferenceRequest and
InferenceAttempt rows, and of the UsageRecords and FailoverEvents they cause), quality records,
chaos settings.

The router (inference.router) calls the recorder with its AttemptInfo steps; this module never
imports the router.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from django.contrib.auth.models import User
from django.db import connection, transaction
from django.utils import timezone

from billing.models import Unit
from billing.services import AMOUNT_QUANTUM, UsageInput, usage_record_batch
from inference.breaker import breakers
from inference.models import ChaosConfig, EvalCase, EvalRun, InferenceAttempt, InferenceRequest, QualityRecord
from inference.selectors import PlanEntry, RoutePlan, rolling_caches_clear
from stack.registry.models import Deployment, FailoverEvent, Workflow
from stack.registry.services import RegistryError, failover_event_record

MILLION = Decimal(1_000_000)
DEMOTION_EVENT_TTL_S = 600.0  # one quality-demotion event per workflow and deployment per 10 min
Outcome = InferenceAttempt.Outcome


@dataclass
class AttemptInfo:
    """One step of a routed request, as the router made it and the recorder writes it (an
    InferenceAttempt row); `cost` is filled in from the ledger when it is recorded."""

    position: int
    entry: PlanEntry
    outcome: str
    status_code: int | None
    latency_ms: float
    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal = Decimal("0")
    error: str = ""
    started_at: float = 0.0  # perf_counter at the start, for time lost between attempts

    @property
    def deployment_id(self) -> int:
        return self.entry.deployment_id

    @property
    def deployment_slug(self) -> str:
        return self.entry.slug

    @property
    def called(self) -> bool:
        return self.outcome in (Outcome.OK, Outcome.RETRYABLE, Outcome.NON_RETRYABLE)


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


@dataclass
class _Job:
    """One request to record; `done` is set once it is written (or its writer gave up)."""

    workflow: Workflow
    plan: RoutePlan
    attempts: Sequence[AttemptInfo]
    values: dict[str, Any]
    billed: dict[int, list[tuple[str, Decimal, Decimal]]]
    demoted: Sequence[tuple[PlanEntry, float]]
    winner: PlanEntry | None
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # set with `done` when this job's thread is to write the next group
    row: InferenceRequest | None = None
    error: BaseException | None = None


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
    """Record one routed request durably: the request, its attempts, a UsageRecord per billed
    unit of each attempt that returned tokens (priced by the ledger, idempotent keys
    `inference:<request>:<attempt>:<unit>`), a FailoverEvent per failed call that led to another
    call, and a quality-demotion event the first time a deployment is skipped for quality.

    The request's cost is the sum of its ledger rows' amounts, so the ledger total equals the
    sum of request costs exactly.

    Group commit: the ledger is a hash chain, so every append holds its head lock until COMMIT.
    Requests recorded at the same time by threads of one process are written together in one
    transaction (one lock, one fsync) by whichever of them leads; each returns only once its own
    rows are committed. A lone request is simply written by its own thread.
    """
    now = timezone.now()
    answered = next((a for a in reversed(attempts) if a.outcome == Outcome.OK), None)
    billed = {a.position: _billable_units(a) for a in attempts if a.outcome == Outcome.OK}
    # The ledger prices each row itself; this prediction (same prices, same rounding) lets the
    # request row be written once, and is corrected in the rare case a price changed meanwhile.
    total = sum((_q(_q(qty) * price) for units in billed.values() for _, qty, price in units), Decimal(0))
    values: dict[str, Any] = {
        "workflow_id": workflow.pk,
        "policy_version_id": plan.policy_id,
        "deployment_id": winner.deployment_id if winner is not None else None,
        "status": InferenceRequest.Status.SUCCEEDED if winner is not None else InferenceRequest.Status.FAILED,
        "endpoint": str(endpoint),
        "stream": stream,
        "tokens_in": answered.tokens_in if answered else 0,
        "tokens_out": answered.tokens_out if answered else 0,
        "latency_ms": latency_ms,
        "ttft_ms": ttft_ms,
        "cost": total,
        "currency": winner.currency if winner is not None else "USD",
        "attempts": len(attempts),
        "error": error[:4000],
        "client_request_id": client_request_id or None,
        "response_text": response_text,
        "created_at": now,
    }
    job = _Job(workflow, plan, attempts, values, billed, demoted, winner)
    if connection.in_atomic_block:
        # Inside a caller's transaction: never mix other requests into it.
        _write_jobs([job])
        assert job.row is not None  # noqa: S101 (_write_jobs sets it or raises)
        return job.row
    _group_commit(job)
    if job.error is not None:
        raise job.error
    assert job.row is not None  # noqa: S101
    return job.row


_group_lock = threading.Lock()
_group_pending: list[_Job] = []
_group_leader = False
MAX_GROUP = 64


def _group_commit(job: _Job) -> None:
    """Leader/follower group commit (as databases do for their logs): the first thread in writes
    everything pending, its own job included; whoever queued meanwhile is handed the lead next."""
    global _group_leader
    with _group_lock:
        _group_pending.append(job)
        leading = not _group_leader
        if leading:
            _group_leader = True
    if not leading:
        job.done.wait()
        if not job.lead:
            return  # written by a leader
    while True:
        with _group_lock:
            group = _group_pending[:MAX_GROUP]
            del _group_pending[:MAX_GROUP]
        try:
            _write_group(group)
        finally:
            with _group_lock:
                successor = _group_pending[0] if _group_pending else None
                if successor is None:
                    _group_leader = False
            for other in group:
                if other is not job:
                    other.done.set()
        if successor is not None:
            # Hand the lead on rather than keep writing for others: this request is done.
            successor.lead = True
            successor.done.set()
        if job.row is not None or job.error is not None:
            return


def _write_group(group: list[_Job]) -> None:
    try:
        _write_jobs(group)
    except Exception:  # noqa: BLE001 (one bad job must not fail the others: write them alone)
        if len(group) == 1:
            group[0].error = sys.exc_info()[1]
            return
        for one in group:
            try:
                _write_jobs([one])
            except Exception as exc:  # noqa: BLE001 (handed to that job's own thread)
                one.error = exc


def _write_jobs(jobs: Sequence[_Job]) -> None:
    """Write the jobs in one transaction (see inference_request_record)."""
    with transaction.atomic():
        rows = [_request_insert(**job.values) for job in jobs]
        items: list[UsageInput] = []
        for job, row in zip(jobs, rows, strict=True):
            by_position = {a.position: a for a in job.attempts}
            now = job.values["created_at"]
            for pos, units in job.billed.items():
                deployment = by_position[pos].entry.deployment
                for unit, qty, _ in units:
                    suffix = "in" if unit == Unit.INPUT_TOKENS_1M else "out"
                    items.append(
                        UsageInput(
                            unit=unit,
                            quantity=qty,
                            occurred_at=now,
                            idempotency_key=f"inference:{row.pk}:{pos}:{suffix}",
                            subject_type="inference_request",
                            subject_id=str(row.pk),
                            deployment=deployment,
                            workflow=job.workflow,
                            description=f"{job.workflow.slug} via {deployment.slug}",
                        )
                    )
        costs: dict[tuple[int, int], Decimal] = {}
        if items:
            for record in usage_record_batch(items=items, prices=jobs[0].plan.prices):
                _, request_part, position_part, _ = record.idempotency_key.split(":")
                key = (int(request_part), int(position_part))
                costs[key] = costs.get(key, Decimal(0)) + record.amount
        for job, row in zip(jobs, rows, strict=True):
            actual = sum((c for (rid, _), c in costs.items() if rid == row.pk), Decimal(0))
            if actual != row.cost:
                InferenceRequest.objects.filter(pk=row.pk).update(cost=actual)
                row.cost = actual
            for a in job.attempts:
                a.cost = costs.get((row.pk, a.position), Decimal(0))
        _attempts_insert([(row.pk, a) for job, row in zip(jobs, rows, strict=True) for a in job.attempts])
        for job, row in zip(jobs, rows, strict=True):
            _failover_events(job, row)
    for job, row in zip(jobs, rows, strict=True):
        job.row = row


def _failover_events(job: _Job, row: InferenceRequest) -> None:
    workflow, plan, winner = job.workflow, job.plan, job.winner
    now = job.values["created_at"]
    currency = job.values["currency"]
    called = [a for a in job.attempts if a.called]
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
            details={"workflow": workflow.slug, "policy_version": plan.version, "outcome": failed.outcome},
        )
    for entry, score in job.demoted:
        if breakers().claim_once(f"demoted:{workflow.pk}:{entry.deployment_id}", ttl_s=DEMOTION_EVENT_TTL_S):
            failover_event_record(
                kind=FailoverEvent.Kind.INFERENCE,
                reason=(
                    f"quality demotion: {entry.slug} rolling score {score:.3f} "
                    f"below the floor {plan.policy.quality_floor:.3f} of {workflow.slug}"
                ),
                detected_at=now,
                from_deployment=entry.deployment,
                to_deployment=winner.deployment if winner is not None else None,
                subject=f"workflow:{workflow.slug}",
                details={
                    "workflow": workflow.slug,
                    "score": score,
                    "floor": plan.policy.quality_floor,
                    "demotion": True,
                },
            )


# Plain INSERTs for the two hot tables: the ORM's statement building costs several times the
# round trip on the router's path (measured by `manage.py bench gateway`). Values are adapted by
# each field's own get_db_prep_save, as the ORM would.
_REQUEST_FIELDS = [f for f in InferenceRequest._meta.concrete_fields if not f.primary_key]
_ATTEMPT_FIELDS = [f for f in InferenceAttempt._meta.concrete_fields if not f.primary_key]


def _request_insert(**values: object) -> InferenceRequest:
    table = connection.ops.quote_name(InferenceRequest._meta.db_table)
    columns = ", ".join(connection.ops.quote_name(f.column) for f in _REQUEST_FIELDS)
    marks = ", ".join(["%s"] * len(_REQUEST_FIELDS))
    params = [f.get_db_prep_save(values[f.attname], connection) for f in _REQUEST_FIELDS]
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks}) RETURNING id", params)  # noqa: S608
        (pk,) = cursor.fetchone()
    row = InferenceRequest(pk=pk, **values)
    row._state.adding = False
    row._state.db = connection.alias
    return row


def _attempts_insert(attempts: Sequence[tuple[int, AttemptInfo]]) -> None:
    if not attempts:
        return
    table = connection.ops.quote_name(InferenceAttempt._meta.db_table)
    columns = ", ".join(connection.ops.quote_name(f.column) for f in _ATTEMPT_FIELDS)
    one = "(" + ", ".join(["%s"] * len(_ATTEMPT_FIELDS)) + ")"
    params: list[Any] = []
    for request_id, a in attempts:
        values = {
            "request_id": request_id,
            "position": a.position,
            "deployment_id": a.deployment_id,
            "status_code": a.status_code,
            "outcome": str(a.outcome),
            "latency_ms": a.latency_ms,
            "tokens_in": a.tokens_in,
            "tokens_out": a.tokens_out,
            "cost": a.cost,
            "error": a.error,
        }
        params += [f.get_db_prep_save(values[f.attname], connection) for f in _ATTEMPT_FIELDS]
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {table} ({columns}) VALUES {', '.join([one] * len(attempts))}", params)  # noqa: S608


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
