"""inference_request_record: the one writer of InferenceRequest rows (and, through the fold, of
their attempts, usage records and failover events)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from billing.budgets import Admission, budget_hand_off
from inference.models import InferenceRequest
from inference.recording.attempts import (
    AttemptInfo,
    Outcome,
    billable_units,
    db_json,
    db_text,
    quantize_amount,
)
from inference.recording.fold import FoldAttempt, FoldJob, fold_jobs
from inference.recording.journal import journal_nudge
from inference.selectors import PlanEntry, RoutePlan
from registry.models import Workflow


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
    response_doc: dict[str, Any] | None = None,
    request_digest: str = "",
    answer_kept_until: datetime | None = None,
    demoted: Sequence[tuple[PlanEntry, float]] = (),
    inline: bool = False,
    holds: Sequence[Admission] = (),
    breaker_transitions: Sequence[tuple[int, str, str]] = (),
    api_key_id: int | None = None,
    bill_to: str = "",
    kept: dict[str, Any] | None = None,
    request_id: int | None = None,
) -> InferenceRequest:
    """Record one routed request durably; returns its row (whose `cost` the answer reports).

    Two ways, chosen by settings.INFERENCE_RECORDING (docs/inference-internals.md, "Recording requests"):

    - journal (production on PostgreSQL): one INSERT, committed before the answer is sent,
      writes the request row together with its journal entry (the attempts and billed units as
      JSON). A folder thread in each web process (and a beat task for stragglers) folds
      journaled requests into attempts, hash-chained ledger rows, budget spend and failover
      events, many requests per transaction (inference.recording.journal).
    - inline: the same writes in the request's own transaction; requests recorded at the same
      time by threads of one process share a transaction (group commit).

    `inline=True` forces the second way; inside a caller's transaction the recording is inline
    as well. `holds`: the hard budgets' admissions the request holds. Their reservations must
    last until its spend is in the ledger, or the budget could be overrun in between: a
    journaled request hands them to its fold (they travel in the journal entry, and the fold
    releases them once it has committed the spend); after an inline recording the caller
    settles them.

    `kept`: the request's input and answer for a workflow that keeps prompts (inference.retention);
    the fold writes it as a RetainedPrompt with the ledger rows.

    The row's cost is predicted from the plan's prices with the ledger's rounding; the fold
    corrects it in the rare case a price changed in between, so the ledger total equals the sum
    of request costs exactly.
    """
    now = timezone.now()
    for a in attempts:
        if a.error:
            a.error = db_text(a.error)  # also the reason of a failover event
    answered = next((a for a in reversed(attempts) if a.outcome == Outcome.OK), None)
    billed: list[tuple[int, str, Decimal]] = []
    for a in attempts:
        if a.outcome != Outcome.OK:
            continue
        units = billable_units(a)
        a.cost = sum((quantize_amount(quantize_amount(qty) * price) for _, qty, price in units), Decimal(0))
        billed += [(a.position, unit, qty) for unit, qty, _ in units]
    total = sum((a.cost for a in attempts if a.outcome == Outcome.OK), Decimal(0))
    avoided = next((a.cost_avoided for a in attempts if a.cost_avoided is not None), None)
    currency = winner.currency if winner is not None else "USD"
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
        "cost_avoided": avoided,
        "currency": currency,
        "attempts": len(attempts),
        "error": db_text(error[:4000]),
        "client_request_id": client_request_id or None,
        "response_text": db_text(response_text),
        "response_doc": db_json(response_doc) if response_doc is not None else None,
        "request_digest": request_digest,
        "answer_kept_until": answer_kept_until,
        "created_at": now,
        "ledger_pending": None,
    }
    if request_id is not None:  # reserved up front (request_id_reserve): a streamed answer's id
        values["id"] = request_id
    fold = FoldJob(
        request_id=0,  # known once the row is inserted
        workflow_id=workflow.pk,
        created_at=now,
        predicted_cost=total,
        currency=currency,
        attempts=[
            FoldAttempt(
                a.position,
                a.deployment_id,
                str(a.outcome),
                a.status_code,
                a.latency_ms,
                a.tokens_in,
                a.tokens_out,
                a.error,
                a.started_at,
                a.code,
            )  # fmt: skip
            for a in attempts
        ],
        billed=billed,
        demoted=[(entry.deployment_id, score) for entry, score in demoted],
        winner_id=winner.deployment_id if winner is not None else None,
        policy_version=plan.version if plan.policy_id is not None else None,
        quality_floor=plan.policy.quality_floor,
        breaker=list(breaker_transitions),
        api_key_id=api_key_id,
        bill_to=bill_to,
        kept=db_json(kept) if kept is not None else None,  # prompts may hold NUL, jsonb may not
        cost_avoided=avoided,
    )
    if not (inline or settings.INFERENCE_RECORDING == "inline" or connection.in_atomic_block):
        # One statement in autocommit: the row and its journal entry are durable (committed)
        # before the caller answers; the folder writes the rest within moments.
        fold.holds = [hold for admission in holds for hold in admission.reservations if not admission.settled]
        values["ledger_pending"] = fold.journal()
        row = _request_insert(values)
        for admission in holds:  # durable in the entry now: the fold releases them
            budget_hand_off(admission)
        journal_nudge()
        return row
    job = _Job(workflow, plan, attempts, values, fold)
    if connection.in_atomic_block:
        # Inside a caller's transaction: never mix other requests into it.
        _write_jobs([job])
    else:
        _group_commit(job)
        if job.error is not None:
            raise job.error
    assert job.row is not None  # noqa: S101 (_write_jobs sets it or raises)
    return job.row


@dataclass
class _Job:
    """One request to record inline; `done` is set once it is written (or its writer gave up)."""

    workflow: Workflow
    plan: RoutePlan
    attempts: Sequence[AttemptInfo]
    values: dict[str, Any]
    fold: FoldJob
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # set with `done` when this job's thread is to write the next group
    row: InferenceRequest | None = None
    error: BaseException | None = None


_group_lock = threading.Lock()
_group_pending: list[_Job] = []
_group_leader = False
MAX_GROUP = 64


def _group_commit(job: _Job) -> None:
    """Leader/follower group commit (as databases do for their logs): the first thread in writes
    everything pending, its own job included; whoever queued meanwhile is handed the lead next.
    The ledger is a hash chain whose head lock is held until COMMIT, so requests recorded at the
    same time share one lock and one fsync; each returns only once its own rows are committed."""
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
    """Insert the jobs' rows and fold them, in one transaction."""
    with transaction.atomic():
        rows = [_request_insert(job.values) for job in jobs]
        for job, row in zip(jobs, rows, strict=True):
            job.fold.request_id = row.pk
        deployments = {e.deployment_id: e.deployment for job in jobs for e in job.plan.entries}
        deployments.update({a.entry.deployment_id: a.entry.deployment for job in jobs for a in job.attempts})
        folded = fold_jobs(
            [job.fold for job in jobs],
            deployments=deployments,
            workflows={job.workflow.pk: job.workflow for job in jobs},
            prices=jobs[0].plan.prices,
        )
    for job, row in zip(jobs, rows, strict=True):
        result = folded[row.pk]
        row.cost = result.cost
        for a in job.attempts:
            a.cost = result.attempt_costs[a.position]
        job.row = row


# A plain INSERT for the hot table: the ORM's statement building costs several times the round
# trip on the router's path (measured by `manage.py bench gateway`). Values are adapted by each
# field's own get_db_prep_save, as the ORM would.
_REQUEST_FIELDS = [f for f in InferenceRequest._meta.concrete_fields if not f.primary_key]
_REQUEST_SQL: dict[tuple[str, bool], str] = {}


def _request_insert(values: dict[str, Any]) -> InferenceRequest:
    """INSERT one request row; its id is drawn by the database unless `values` carries a reserved one."""
    reserved = values.get("id")
    fields = _REQUEST_FIELDS if reserved is None else [InferenceRequest._meta.pk, *_REQUEST_FIELDS]
    key = (connection.vendor, reserved is not None)
    sql = _REQUEST_SQL.get(key)
    if sql is None:
        table = connection.ops.quote_name(InferenceRequest._meta.db_table)
        columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
        marks = ", ".join(["%s"] * len(fields))
        sql = _REQUEST_SQL[key] = f"INSERT INTO {table} ({columns}) VALUES ({marks}) RETURNING id"  # noqa: S608
    params = [f.get_db_prep_save(values[f.attname], connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        (pk,) = cursor.fetchone()
    row = InferenceRequest(**{**values, "id": pk})
    row._state.adding = False
    row._state.db = connection.alias
    return row


def request_id_reserve() -> int:
    """Draw the id the next recorded request will carry, before it is recorded: a streamed answer
    names its request in every chunk's id (`chatcmpl-sy<id>`, as a plain answer does) but is
    recorded only once it has ended. PostgreSQL: the id column's sequence. SQLite (AUTOINCREMENT,
    as Django declares ids there): the table's counter in sqlite_sequence, moved under SQLite's
    write lock. An id drawn and never used leaves a gap, as a rolled-back insert does."""
    table = InferenceRequest._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, 'id'))", [table])
            return int(cursor.fetchone()[0])
        with transaction.atomic():
            cursor.execute("UPDATE sqlite_sequence SET seq = seq + 1 WHERE name = %s RETURNING seq", [table])
            row = cursor.fetchone()
            if row is None:  # no row inserted yet: the counter starts after the largest id
                quoted = connection.ops.quote_name(table)
                cursor.execute(
                    f"INSERT INTO sqlite_sequence (name, seq) SELECT %s, coalesce(max(id), 0) + 1 FROM {quoted} RETURNING seq",  # noqa: S608
                    [table],
                )
                row = cursor.fetchone()
        return int(row[0])
