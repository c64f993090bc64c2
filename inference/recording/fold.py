"""Folding recorded requests into the ledger: attempts, usage records, failover events.

A FoldJob is everything a request's bookkeeping needs, as plain values, so the same code folds
a request the moment it is answered (inline recording) or later from its journal entry
(inference.recording.journal). `fold_jobs` runs inside the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection
from django.utils import timezone

from billing.selectors import PriceResolver
from billing.services import UsageInput, usage_record_batch
from inference.breaker.breakers import breakers
from inference.models import InferenceAttempt, InferenceRequest
from inference.recording.attempts import UNIT_SUFFIX, Outcome
from inference.retention import retained_prompts_write
from inference.selectors import fold_cache
from registry.failover_codes import FailoverCode, failover_code_for_status
from registry.models import Deployment, FailoverEvent, Workflow
from registry.services import failover_event_record

DEMOTION_EVENT_TTL_S = 600.0  # one quality-demotion event per workflow and deployment per 10 min
JOURNAL_VERSION = 1


@dataclass
class FoldAttempt:
    position: int
    deployment_id: int
    outcome: str
    status_code: int | None
    latency_ms: float
    tokens_in: int
    tokens_out: int
    error: str
    started_at: float  # perf_counter of the call's start (only differences are used)
    # The failed call's failover code; entries journaled before codes existed have none, and
    # their code follows from the status (FoldAttempt(*values) takes either length).
    code: str = ""

    @property
    def called(self) -> bool:
        return self.outcome in (Outcome.OK, Outcome.RETRYABLE, Outcome.NON_RETRYABLE)


@dataclass
class FoldJob:
    """One answered (or failed) request whose row exists and whose bookkeeping is due."""

    request_id: int
    workflow_id: int
    created_at: datetime
    predicted_cost: Decimal
    currency: str
    attempts: list[FoldAttempt]
    billed: list[tuple[int, str, Decimal]]  # (attempt position, unit, quantity), in order
    demoted: list[tuple[int, float]] = field(default_factory=list)  # (deployment id, score)
    winner_id: int | None = None
    policy_version: int | None = None
    quality_floor: float | None = None
    # Circuit transitions the request's calls caused: (deployment id, opened/closed, cause code).
    breaker: list[tuple[int, str, str]] = field(default_factory=list)
    api_key_id: int | None = None  # the request's API key: its ledger rows name it
    # The ledger subject "<type>:<id>" its rows are billed to; "" bills the request itself
    # ("inference_request:<id>"). The idempotency keys stay the request's either way.
    bill_to: str = ""
    # The kept input and answer (inference.retention), only for a workflow that keeps prompts.
    kept: dict[str, Any] | None = None
    # A response-cache hit: the cost it avoided, carried onto its ledger row.
    cost_avoided: Decimal | None = None
    # Hard budgets' reservations the request still holds, (BudgetPeriod id, amount): released
    # by the journal's fold once the spend is committed (billing.budgets.budget_holds_release).
    holds: list[tuple[int, Decimal]] = field(default_factory=list)

    def journal(self) -> dict[str, Any]:
        """The journal entry (JSON) kept on the request row until the job is folded."""
        return {
            "v": JOURNAL_VERSION,
            "attempts": [
                [
                    a.position,
                    a.deployment_id,
                    a.outcome,
                    a.status_code,
                    a.latency_ms,
                    a.tokens_in,
                    a.tokens_out,
                    a.error,
                    a.started_at,
                    a.code,
                ]  # fmt: skip
                for a in self.attempts
            ],
            # Quantities as text: Decimal survives JSON exactly that way.
            "billed": [[position, unit, str(quantity)] for position, unit, quantity in self.billed],
            "demoted": [[deployment_id, score] for deployment_id, score in self.demoted],
            "winner": self.winner_id,
            "policy_version": self.policy_version,
            "quality_floor": self.quality_floor,
            "breaker": [list(t) for t in self.breaker],
            # Optional: entries journaled before keys were recorded have none (no key).
            "api_key": self.api_key_id,
            # Optional: entries journaled before bill-to subjects existed bill the request.
            "bill_to": self.bill_to,
            # Only for a workflow that opted in to keeping prompts; cleared with the entry.
            **({"kept": self.kept} if self.kept is not None else {}),
            **({"avoided": str(self.cost_avoided)} if self.cost_avoided is not None else {}),
            **({"holds": [[pk, str(amount)] for pk, amount in self.holds]} if self.holds else {}),
        }

    @classmethod
    def from_journal(
        cls,
        *,
        request_id: int,
        workflow_id: int,
        created_at: datetime,
        cost: Decimal,
        currency: str,
        doc: Mapping[str, Any],
    ) -> FoldJob:
        if doc.get("v") != JOURNAL_VERSION:
            raise ValueError(f"request {request_id}: unknown journal version {doc.get('v')!r}")
        return cls(
            request_id=request_id,
            workflow_id=workflow_id,
            created_at=created_at,
            predicted_cost=cost,
            currency=currency,
            attempts=[FoldAttempt(*values) for values in doc["attempts"]],
            billed=[(int(p), str(u), Decimal(q)) for p, u, q in doc["billed"]],
            demoted=[(int(d), float(s)) for d, s in doc["demoted"]],
            winner_id=doc["winner"],
            policy_version=doc["policy_version"],
            quality_floor=doc["quality_floor"],
            # Entries journaled before transitions were recorded have none.
            breaker=[(int(d), str(t), str(c)) for d, t, c in doc.get("breaker", [])],
            api_key_id=doc.get("api_key"),
            bill_to=str(doc.get("bill_to") or ""),
            cost_avoided=Decimal(doc["avoided"]) if doc.get("avoided") is not None else None,
            kept=doc.get("kept"),
            # Entries journaled before holds were handed to the fold (or with none) hold nothing.
            holds=[(int(pk), Decimal(amount)) for pk, amount in doc.get("holds", [])],
        )


def bill_to_subject(bill_to: str) -> tuple[str, str] | None:
    """("training_run", "12") from "training_run:12"; None for "" (bill the request)."""
    if not bill_to:
        return None
    subject_type, sep, subject_id = bill_to.partition(":")
    if not sep or not subject_type or not subject_id:
        raise ValueError(f"bill_to must be <subject type>:<subject id>, got {bill_to!r}")
    return subject_type, subject_id


@dataclass
class Folded:
    """What folding wrote for one request: its cost from the ledger and each attempt's share."""

    cost: Decimal
    attempt_costs: dict[int, Decimal]


def fold_jobs(
    jobs: Sequence[FoldJob],
    *,
    deployments: Mapping[int, Deployment] | None = None,
    workflows: Mapping[int, Workflow] | None = None,
    prices: PriceResolver | None = None,
) -> dict[int, Folded]:
    """Write the jobs' usage records, attempts and failover events; call inside a transaction.

    A UsageRecord per billed unit of each answered attempt (priced by the ledger, idempotent
    keys `inference:<request>:<attempt>:<unit>`), an InferenceAttempt per step, a FailoverEvent
    per failed call that led to another call, and a quality-demotion event the first time a
    deployment is skipped for quality. A request whose ledger amounts differ from the predicted
    cost on its row (a price changed in between) gets the ledger's sum, so the ledger total
    always equals the sum of request costs.
    """
    if deployments is None or workflows is None or prices is None:
        # Folding from the journal: prices and rows shared by this process's folds (a fold of a
        # few requests would otherwise spend most of its time building them again).
        cache = fold_cache()
        prices = prices if prices is not None else cache.prices
        if deployments is None:
            ids = {a.deployment_id for job in jobs for a in job.attempts}
            ids |= {d for job in jobs for d, _ in job.demoted}
            missing = ids - cache.deployments.keys()
            if missing:
                cache.deployments.update(
                    Deployment.objects.select_related("provider", "model").in_bulk(missing)
                )
            deployments = cache.deployments
        if workflows is None:
            missing = {job.workflow_id for job in jobs} - cache.workflows.keys()
            if missing:
                cache.workflows.update(Workflow.objects.select_related("team").in_bulk(missing))
            workflows = cache.workflows
    items: list[UsageInput] = []
    for job in jobs:
        workflow = workflows[job.workflow_id]
        by_position = {a.position: a for a in job.attempts}
        subject_type, subject_id = bill_to_subject(job.bill_to) or ("inference_request", str(job.request_id))
        for position, unit, quantity in job.billed:
            deployment = deployments[by_position[position].deployment_id]
            items.append(
                UsageInput(
                    unit=unit,
                    quantity=quantity,
                    occurred_at=job.created_at,
                    idempotency_key=f"inference:{job.request_id}:{position}:{UNIT_SUFFIX[unit]}",
                    subject_type=subject_type,
                    subject_id=subject_id,
                    deployment=deployment,
                    workflow=workflow,
                    api_key_id=job.api_key_id,
                    description=f"{workflow.slug} via {deployment.slug}"
                    + (" (response cache)" if job.cost_avoided is not None else ""),
                    cost_avoided=job.cost_avoided,
                )
            )
    costs: dict[tuple[int, int], Decimal] = {}
    if items:
        for record in usage_record_batch(items=items, prices=prices):
            _, request_part, position_part, _ = record.idempotency_key.split(":")
            key = (int(request_part), int(position_part))
            costs[key] = costs.get(key, Decimal(0)) + record.amount
    out: dict[int, Folded] = {}
    for job in jobs:
        attempt_costs = {
            a.position: costs.get((job.request_id, a.position), Decimal(0)) for a in job.attempts
        }
        total = sum(attempt_costs.values(), Decimal(0))
        if total != job.predicted_cost:
            InferenceRequest.objects.filter(pk=job.request_id).update(cost=total)
        out[job.request_id] = Folded(cost=total, attempt_costs=attempt_costs)
    _attempts_insert(jobs, out)
    retained_prompts_write(
        [(job.request_id, job.workflow_id, job.created_at, job.kept) for job in jobs if job.kept is not None]
    )
    for job in jobs:
        _failover_events(job, deployments, workflows[job.workflow_id], out[job.request_id])
    return out


def _failover_events(
    job: FoldJob, deployments: Mapping[int, Deployment], workflow: Workflow, folded: Folded
) -> None:
    called = [a for a in job.attempts if a.called]
    winner = deployments.get(job.winner_id) if job.winner_id is not None else None
    for failed, following in zip(called, called[1:], strict=False):
        if failed.outcome == Outcome.OK:
            continue
        source, target = deployments[failed.deployment_id], deployments[following.deployment_id]
        failover_event_record(
            kind=FailoverEvent.Kind.INFERENCE,
            code=failed.code or failover_code_for_status(failed.status_code),
            reason=f"{source.slug} → {target.slug}: {failed.error}",
            detected_at=job.created_at,
            from_deployment=source,
            to_deployment=target,
            subject=f"inference-request:{job.request_id}",
            time_lost=timedelta(milliseconds=max(following.started_at - failed.started_at, 0) * 1000.0),
            extra_cost=folded.attempt_costs.get(failed.position, Decimal(0)),
            currency=job.currency,
            status_code=failed.status_code,
            details={
                "workflow": workflow.slug,
                "policy_version": job.policy_version,
                "outcome": failed.outcome,
            },
        )
    for deployment_id, transition, cause in job.breaker:
        _breaker_event(
            deployments[deployment_id],
            transition=transition,
            cause=cause,
            at=job.created_at,
            details={"workflow": workflow.slug, "request": job.request_id},
        )
    for deployment_id, score in job.demoted:
        if breakers().claim_once(f"demoted:{workflow.pk}:{deployment_id}", ttl_s=DEMOTION_EVENT_TTL_S):
            demoted = deployments[deployment_id]
            floor = job.quality_floor if job.quality_floor is not None else 0.0
            failover_event_record(
                kind=FailoverEvent.Kind.INFERENCE,
                code=FailoverCode.QUALITY_DEMOTION,
                reason=(
                    f"quality demotion: {demoted.slug} rolling score {score:.3f} "
                    f"below the floor {floor:.3f} of {workflow.slug}"
                ),
                detected_at=job.created_at,
                from_deployment=demoted,
                to_deployment=winner,
                subject=f"workflow:{workflow.slug}",
                details={"workflow": workflow.slug, "score": score, "floor": floor, "demotion": True},
            )


def _breaker_event(
    deployment: Deployment, *, transition: str, cause: str, at: datetime, details: dict[str, Any]
) -> None:
    if transition == "opened":
        code = FailoverCode.CIRCUIT_OPEN
        why = f" after {cause}" if cause else ""
        reason = f"circuit of {deployment.slug} opened{why}: calls skip it until a probe succeeds"
    else:
        code = FailoverCode.CIRCUIT_CLOSED
        reason = f"circuit of {deployment.slug} closed: its half-open probe succeeded"
    failover_event_record(
        kind=FailoverEvent.Kind.INFERENCE,
        code=code,
        reason=reason,
        detected_at=at,
        from_deployment=deployment,
        subject=f"deployment:{deployment.slug}",
        details={**details, "transition": transition, "cause": cause},
    )


def breaker_transition_record(*, deployment_id: int, transition: str, cause: str) -> None:
    """A circuit transition no request carries (see inference.breaker.breakers._SuccessRecorder)."""
    deployment = Deployment.objects.select_related("provider").filter(pk=deployment_id).first()
    if deployment is not None:
        _breaker_event(deployment, transition=transition, cause=cause, at=timezone.now(), details={})


# Plain INSERTs for the hot tables: the ORM's statement building costs several times the round
# trip (measured by `manage.py bench gateway`). Values are adapted by each field's own
# get_db_prep_save, as the ORM would.
_ATTEMPT_FIELDS = [f for f in InferenceAttempt._meta.concrete_fields if not f.primary_key]


def _attempts_insert(jobs: Sequence[FoldJob], folded: Mapping[int, Folded]) -> None:
    rows = [(job.request_id, a) for job in jobs for a in job.attempts]
    if not rows:
        return
    table = connection.ops.quote_name(InferenceAttempt._meta.db_table)
    columns = ", ".join(connection.ops.quote_name(f.column) for f in _ATTEMPT_FIELDS)
    one = "(" + ", ".join(["%s"] * len(_ATTEMPT_FIELDS)) + ")"
    params: list[Any] = []
    for request_id, a in rows:
        values = {
            "request_id": request_id,
            "position": a.position,
            "deployment_id": a.deployment_id,
            "status_code": a.status_code,
            "outcome": str(a.outcome),
            "latency_ms": a.latency_ms,
            "tokens_in": a.tokens_in,
            "tokens_out": a.tokens_out,
            "cost": folded[request_id].attempt_costs[a.position],
            "error": a.error,
        }
        params += [f.get_db_prep_save(values[f.attname], connection) for f in _ATTEMPT_FIELDS]
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {table} ({columns}) VALUES {', '.join([one] * len(rows))}", params)  # noqa: S608
