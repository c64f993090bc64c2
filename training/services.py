"""Writes for training: probe jobs and DiLoCo training runs."""

from __future__ import annotations

import logging
import socket
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F, Max, Sum
from django.utils import timezone
from django.utils.text import slugify

from billing.budgets import budget_may_spend
from billing.models import Unit
from billing.selectors import price_in_force
from billing.services import SECONDS_PER_HOUR, NoPriceError, accelerator_time_bill
from stack.registry.errors import DomainError
from stack.registry.models import Cluster, FailoverEvent, RegisteredModel, WorkerHeartbeat
from stack.registry.services import failover_event_record, failover_event_recover
from training import dispatch, selectors
from training.models import (
    GlobalVersionRecord,
    InvalidTransition,
    LearnerChunk,
    PlacementDecision,
    ProbeJob,
    TrainingLearner,
    TrainingRun,
    TrainingRunTransition,
)
from training.placement import Assignment, Constraints, PlacementResult, place
from training.probe import ProbeConfig, run_probe
from training.run_config import RunConfig, RunConfigError, run_config_validate
from training.run_engines import newest_global, run_initialise, write_artifact

logger = logging.getLogger(__name__)


class DispatchError(DomainError, ValueError):
    """Work that cannot be dispatched (a draining cluster, no price in force)."""


def probe_job_create(*, cluster: Cluster, created_by: User | None, steps: int = 300) -> ProbeJob:
    """Create a probe job and enqueue it on the cluster's queue once committed."""
    if cluster.status == Cluster.Status.DRAINING:
        raise DispatchError(f"cluster {cluster.slug} is draining", field="cluster")
    # Refuse up front what could not be billed at the end: without a price the
    # finished job's ledger write fails and the job would stay `running`.
    price = price_in_force(
        unit=Unit.ACCELERATOR_HOUR, at=timezone.now(), cluster=cluster, provider=cluster.provider
    )
    if price is None:
        raise DispatchError(f"cluster {cluster.slug} has no accelerator-hour price in force", field="cluster")
    # Hard-limit budgets of the cluster (and its provider) fail closed: a spent
    # budget stops new jobs. A read-only check: a probe costs cents and is billed
    # by another process minutes later (see billing.budgets for admit/settle).
    may_spend, why = budget_may_spend(cluster=cluster, provider=cluster.provider)
    if not may_spend:
        raise DispatchError(why, field="cluster")
    job = ProbeJob.objects.create(cluster=cluster, created_by=created_by, steps=steps)
    job_id, slug = job.pk, cluster.slug
    transaction.on_commit(lambda: dispatch.probe_job_run_enqueue(job_id=job_id, cluster_slug=slug))
    return job


def probe_job_claim(*, job_id: int, worker_hostname: str) -> ProbeJob | None:
    """Claim a job for this worker; None when it is finished or gone (a no-op).

    A job still `running` may be claimed again: that happens when the worker
    that had it died and the broker redelivered the message.
    """
    now = timezone.now()
    claimed = ProbeJob.objects.filter(
        pk=job_id, status__in=[ProbeJob.Status.PENDING, ProbeJob.Status.RUNNING]
    ).update(
        status=ProbeJob.Status.RUNNING,
        started_at=now,
        worker_hostname=worker_hostname[:255],
        loss_curve=[],
        error="",
        attempts=F("attempts") + 1,
    )
    if claimed != 1:
        return None
    return ProbeJob.objects.select_related("cluster__provider").get(pk=job_id)


def probe_job_progress(*, job_id: int, loss_curve: list[tuple[int, float]]) -> None:
    ProbeJob.objects.filter(pk=job_id, status=ProbeJob.Status.RUNNING).update(
        loss_curve=[list(p) for p in loss_curve]
    )


def probe_job_finish(
    *,
    job: ProbeJob,
    succeeded: bool,
    wall_seconds: float,
    finished_at: datetime,
    loss_curve: list[tuple[int, float]],
    final_loss: float | None,
    device: str,
    error: str = "",
) -> ProbeJob:
    """Record the outcome and bill the accelerator-seconds, in one transaction."""
    # One accelerator group ran the probe; bill what it held for the run.
    accelerator_seconds = Decimal(str(round(wall_seconds, 3)))
    with transaction.atomic():
        updated = ProbeJob.objects.filter(pk=job.pk, status=ProbeJob.Status.RUNNING).update(
            status=ProbeJob.Status.SUCCEEDED if succeeded else ProbeJob.Status.FAILED,
            finished_at=finished_at,
            loss_curve=[list(p) for p in loss_curve],
            final_loss=final_loss,
            device=device,
            accelerator_seconds=accelerator_seconds,
            error=error[:5000],
        )
        if updated == 1:
            try:
                with transaction.atomic():  # a savepoint: a billing error keeps the outcome
                    accelerator_time_bill(
                        cluster=job.cluster,
                        seconds=accelerator_seconds,
                        accelerators=1,
                        subject_type="probe_job",
                        subject_id=str(job.pk),
                        idempotency_key=f"probe_job:{job.pk}",
                        at=finished_at,
                        description=f"probe job #{job.pk}: {accelerator_seconds}s on {job.cluster.slug}",
                    )
            except NoPriceError as exc:
                # The price vanished after dispatch (it is checked there): the
                # job must not stay `running` forever; it fails, saying why.
                logger.error("probe job %s could not be billed: %s", job.pk, exc)
                ProbeJob.objects.filter(pk=job.pk).update(
                    status=ProbeJob.Status.FAILED, error=f"not billed: {exc}"[:5000]
                )
    job.refresh_from_db()
    return job


def probe_job_execute(*, job_id: int, worker_hostname: str | None = None) -> ProbeJob | None:
    """Run a claimed probe job to completion (called by the worker task)."""
    job = probe_job_claim(job_id=job_id, worker_hostname=worker_hostname or socket.gethostname())
    if job is None:
        logger.info("probe job %s already finished or gone; nothing to do", job_id)
        return None
    curve: list[tuple[int, float]] = []

    def on_progress(step: int, loss: float) -> None:
        curve.append((step, round(loss, 5)))
        if len(curve) % 5 == 0:
            probe_job_progress(job_id=job_id, loss_curve=curve)

    started = timezone.now()
    try:
        result = run_probe(ProbeConfig(steps=job.steps), on_progress)
    except Exception as exc:
        finished = timezone.now()
        logger.exception("probe job %s failed", job_id)
        return probe_job_finish(
            job=job,
            succeeded=False,
            wall_seconds=(finished - started).total_seconds(),
            finished_at=finished,
            loss_curve=curve,
            final_loss=None,
            device="",
            error=f"{type(exc).__name__}: {exc}",
        )
    return probe_job_finish(
        job=job,
        succeeded=True,
        wall_seconds=result.wall_seconds,
        finished_at=timezone.now(),
        loss_curve=result.loss_curve,
        final_loss=result.final_loss,
        device=result.device,
    )


# --- Training runs -------------------------------------------------------------------------
# A run's life: training_run_create (pending) → training_run_place on the control queue
# (placing → running; learners placed, version 0 published) → learner chunks on each cluster's
# queue (training.orchestrator.learner_chunk_execute) and syncer ticks on the control queue
# (training.orchestrator.syncer_tick_execute) → succeeded | failed | cancelled | budget_exhausted.
# training_runs_supervise (beat) restarts a silent syncer and fails lost learners over.


def training_run_create(*, config: dict[str, Any], created_by: User | None, name: str) -> TrainingRun:
    """Validate `config`, create the run in `pending` and dispatch placement after commit.

    Raises RunConfigError (field → messages) before anything is written or dispatched.
    """
    name = (name or "").strip()
    errors: dict[str, list[str]] = {}
    try:
        cfg = run_config_validate(config)
    except RunConfigError as exc:
        errors.update(exc.errors)
        cfg = {}
    if not name:
        errors.setdefault("name", []).append("a run needs a name")
    elif len(name) > 128:
        errors.setdefault("name", []).append("at most 128 characters")
    if errors:
        raise RunConfigError(errors)
    budget = RunConfig(cfg).money_budget
    with transaction.atomic():
        run = TrainingRun.objects.create(
            name=name,
            config=cfg,
            created_by=created_by,
            money_budget=budget,
            currency=cfg["currency"],
            reason="created",
        )
        TrainingRunTransition.objects.create(
            run=run, from_state="", to_state=run.state, at=run.created_at, reason="created"
        )
        run_id = run.pk
        transaction.on_commit(lambda: dispatch.training_run_place_enqueue(run_id=run_id))
    return run


def training_run_cancel(*, run: TrainingRun, reason: str, by: User | None) -> TrainingRun:
    """Stop a run: in-flight chunks notice within a couple of seconds and bill nothing after."""
    who = f" by {by.get_username()}" if by is not None else ""
    why = (reason or "").strip() or "cancelled"
    try:
        run.transition(TrainingRun.State.CANCELLED, reason=f"{why}{who}")
    except InvalidTransition as exc:
        raise RunStateError(
            f"run #{run.pk} is {run.state}; only a pending or live run can be cancelled"
        ) from exc
    TrainingLearner.objects.filter(run=run).exclude(state=TrainingLearner.State.DONE).update(
        state=TrainingLearner.State.RELEASED, state_changed_at=run.state_changed_at
    )
    return run


class RunStateError(DomainError, ValueError):
    """An action that the run's current state does not allow; the message is shown as is."""

    status_code = 400


# --- Placement -------------------------------------------------------------------------------


def _constraints(rc: RunConfig) -> Constraints:
    place_cfg = rc.raw["placement"]
    return Constraints(
        accelerator_type=place_cfg["accelerator_type"],
        regions=tuple(place_cfg["regions"]),
        pins={int(k): v for k, v in place_cfg["pins"].items()},
    )


def _decision(
    *,
    run: TrainingRun,
    index: int,
    generation: int,
    assignment: Assignment,
    result: PlacementResult,
    reason: str,
    now: datetime,
) -> PlacementDecision:
    option = assignment.option
    decision, _ = PlacementDecision.objects.get_or_create(
        run=run,
        learner_index=index,
        generation=generation,
        defaults={
            "cluster_id": option.cluster_id,
            "reason": reason,
            "unit_price": option.price,
            "currency": option.currency,
            "price_book_id": option.price_book_id,
            "candidates": result.candidates,
            "decided_at": now,
        },
    )
    return decision


def training_run_place(*, run_id: int) -> TrainingRun | None:
    """Place a pending run's learners, publish version 0 and start it (the control task).

    Idempotent: a run already past `placing` is left alone; a run stuck in `placing` (its
    worker died) is placed again by the supervisor, and version 0 is write-once.
    """
    run = TrainingRun.objects.filter(pk=run_id).first()
    if run is None:
        return None
    if run.state == TrainingRun.State.PENDING:
        try:
            run.transition(TrainingRun.State.PLACING, reason="choosing clusters")
        except InvalidTransition:
            return run
    elif run.state != TrainingRun.State.PLACING:
        return run
    now = timezone.now()
    rc = RunConfig(run.config)
    result = place(
        learners=list(range(rc.learners)),
        options=selectors.cluster_options(at=now, exclude_run_id=run.pk),
        constraints=_constraints(rc),
    )
    if len(result.assignments) < rc.quorum:
        reason = (
            f"placement: {len(result.assignments)} of {rc.learners} learners placed, quorum is {rc.quorum}; "
            + "; ".join(result.problems)
        )
        _transition_quietly(run, TrainingRun.State.FAILED, reason=reason)
        return run
    try:
        initial_loss = run_initialise(run)
    except Exception as exc:  # a bad dataset or store URL: the run fails, saying why
        logger.exception("run %s could not be initialised", run.pk)
        _transition_quietly(
            run, TrainingRun.State.FAILED, reason=f"initialisation failed: {type(exc).__name__}: {exc}"
        )
        return run
    placed = {a.learner_index: a for a in result.assignments}
    token = uuid.uuid4().hex
    # Started now, after version 0 is published: the run's and the learners' clocks start when
    # the learners can train (initialising loads the corpus and evaluates version 0).
    now = timezone.now()
    with transaction.atomic():
        locked = TrainingRun.objects.select_for_update().get(pk=run.pk)
        if locked.state != TrainingRun.State.PLACING:
            return locked
        learners = []
        for index in range(rc.learners):
            a = placed.get(index)
            learner, _ = TrainingLearner.objects.get_or_create(
                run=run,
                index=index,
                defaults={
                    "cluster_id": a.option.cluster_id if a else None,
                    "state": TrainingLearner.State.PLACED if a else TrainingLearner.State.LOST,
                    "state_changed_at": now,
                    "last_error": "" if a else "not placed: " + "; ".join(result.problems),
                },
            )
            learners.append(learner)
            if a is not None:
                reason = PlacementDecision.Reason.PINNED if a.pinned else PlacementDecision.Reason.INITIAL
                _decision(
                    run=run, index=index, generation=0, assignment=a, result=result, reason=reason, now=now
                )
        TrainingRun.objects.filter(pk=run.pk).update(
            initial_eval_loss=initial_loss, syncer_token=token, syncer_seen_at=now
        )
        run.initial_eval_loss, run.syncer_token = initial_loss, token
        where = ", ".join(f"learner {i} → {placed[i].option.slug}" for i in sorted(placed))
        missing = f"; {rc.learners - len(placed)} unplaced, retrying" if len(placed) < rc.learners else ""
        run.transition(TrainingRun.State.RUNNING, reason=f"placed {where}{missing}", now=now)
        chunk_targets = [
            (ln.pk, ln.generation, placed[ln.index].option.slug) for ln in learners if ln.index in placed
        ]
        transaction.on_commit(lambda: _enqueue_start(run_id=run.pk, token=token, chunks=chunk_targets))
    return run


def _enqueue_start(*, run_id: int, token: str, chunks: list[tuple[int, int, str]]) -> None:
    for learner_id, generation, slug in chunks:
        dispatch.learner_chunk_enqueue(learner_id=learner_id, generation=generation, seq=0, cluster_slug=slug)
    dispatch.syncer_tick_enqueue(run_id=run_id, token=token)


def _transition_quietly(run: TrainingRun, new: str, *, reason: str) -> bool:
    """Transition, or return False when another process already moved the run on."""
    try:
        run.transition(new, reason=reason)
    except InvalidTransition:
        return False
    return True


# --- Learner chunks ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkClaim:
    run: TrainingRun
    learner: TrainingLearner
    chunk: LearnerChunk


def _learner_stopped(learner: TrainingLearner, run: TrainingRun, generation: int) -> str:
    if run.state not in (TrainingRun.State.RUNNING, TrainingRun.State.RECOVERING):
        return f"run {run.state}"
    if learner.generation != generation:
        return f"learner re-placed (generation {learner.generation})"
    if learner.state in (
        TrainingLearner.State.LOST,
        TrainingLearner.State.DONE,
        TrainingLearner.State.RELEASED,
    ):
        return f"learner {learner.state}"
    return ""


def learner_chunk_claim(
    *, learner_id: int, generation: int, seq: int, worker_hostname: str
) -> ChunkClaim | None:
    """Claim chunk `seq` of a learner's generation; None means "nothing to do" (a no-op).

    A finished chunk, a stale generation (the learner was re-placed) or a run that is no
    longer live are no-ops. A started but unfinished chunk is a redelivery after its worker
    died: it starts over on this worker. A spent money budget stops the run here, before
    anything more is trained or billed.
    """
    now = timezone.now()
    exhausted_run: TrainingRun | None = None
    with transaction.atomic():
        learner = (
            TrainingLearner.objects.select_for_update(of=("self",))
            .select_related("run", "cluster")
            .filter(pk=learner_id)
            .first()
        )
        if learner is None or learner.cluster is None:
            return None
        run = learner.run
        if _learner_stopped(learner, run, generation):
            return None
        existing = LearnerChunk.objects.filter(learner=learner, generation=generation, seq=seq).first()
        if existing is not None and existing.finished_at is not None:
            # Redelivered after it finished: make sure the chain of chunks goes on.
            if (
                existing.error == ""
                and not LearnerChunk.objects.filter(
                    learner=learner, generation=generation, seq=seq + 1
                ).exists()
            ):
                _enqueue_next_chunk(learner=learner, generation=generation, seq=seq + 1)
            return None
        if run.money_budget is not None and selectors.run_spend(run_id=run.pk) >= run.money_budget:
            exhausted_run = run
        else:
            if existing is None:
                chunk = LearnerChunk.objects.create(
                    learner=learner,
                    generation=generation,
                    seq=seq,
                    cluster=learner.cluster,
                    accelerators=selectors.accelerators_per_learner(learner.cluster),
                    worker_hostname=worker_hostname[:255],
                    started_at=now,
                    progress_at=now,
                )
            else:
                chunk = existing
                LearnerChunk.objects.filter(pk=chunk.pk).update(
                    worker_hostname=worker_hostname[:255], started_at=now, progress_at=now, steps=0, tokens=0
                )
                chunk.refresh_from_db()
            TrainingLearner.objects.filter(pk=learner.pk).update(
                state=TrainingLearner.State.RUNNING, worker_hostname=worker_hostname[:255]
            )
            learner.state = TrainingLearner.State.RUNNING
    if exhausted_run is not None:
        training_run_budget_exhaust(run=exhausted_run)
        return None
    return ChunkClaim(run=run, learner=learner, chunk=chunk)


def learner_chunk_progress(
    *,
    chunk_id: int,
    learner_id: int,
    steps: int,
    tokens: int,
    deltas_pushed: int,
    bytes_sent: int,
    tokens_at_push: int,
) -> None:
    """A chunk pushed deltas: record how far it got (a killed chunk leaves this behind)."""
    now = timezone.now()
    chunk = LearnerChunk.objects.filter(pk=chunk_id, finished_at__isnull=True)
    chunk.update(
        steps=steps, tokens=tokens, deltas_pushed=deltas_pushed, bytes_sent=bytes_sent, progress_at=now
    )
    TrainingLearner.objects.filter(pk=learner_id).update(tokens_at_last_push=tokens_at_push, last_push_at=now)


def learner_chunk_should_stop(*, learner_id: int, generation: int) -> str:
    """Why a running chunk must stop now ("" to go on): the run ended or the learner moved."""
    learner = TrainingLearner.objects.select_related("run").filter(pk=learner_id).first()
    if learner is None:
        return "learner gone"
    return _learner_stopped(learner, learner.run, generation)


def _billable_seconds(*, run: TrainingRun, started_at: datetime, wall_seconds: float) -> float:
    """Seconds to bill: all of them, except that nothing after a run's end is billed."""
    if run.is_finished and run.finished_at is not None:
        return max(0.0, min(wall_seconds, (run.finished_at - started_at).total_seconds()))
    return max(0.0, wall_seconds)


def _bill_chunk(*, chunk: LearnerChunk, learner: TrainingLearner, occurred_at: datetime) -> bool:
    if chunk.accelerator_seconds <= 0:
        return False
    try:
        with transaction.atomic():  # a savepoint: a billing error keeps the chunk's outcome
            accelerator_time_bill(
                cluster=chunk.cluster,
                seconds=chunk.accelerator_seconds,
                accelerators=chunk.accelerators,
                subject_type=selectors.RUN_SUBJECT_TYPE,
                subject_id=str(learner.run_id),
                idempotency_key=chunk.billing_key,
                at=occurred_at,
                description=(
                    f"training run #{learner.run_id} learner {learner.index} g{chunk.generation} "
                    f"chunk {chunk.seq}: {chunk.accelerator_seconds}s × {chunk.accelerators} on {chunk.cluster.slug}"
                )[:200],
            )
    except NoPriceError as exc:
        logger.error("chunk %s could not be billed: %s", chunk.pk, exc)
        LearnerChunk.objects.filter(pk=chunk.pk).update(error=f"not billed: {exc}"[:5000])
        return False
    LearnerChunk.objects.filter(pk=chunk.pk).update(billed=True)
    return True


def learner_chunk_finish(
    *,
    chunk_id: int,
    outcome: Any,
    wall_seconds: float,
    started_at: datetime,
    finished_at: datetime,
    error: str = "",
) -> LearnerChunk | None:
    """Record a chunk's outcome, bill its accelerator-seconds and enqueue the next chunk."""
    with transaction.atomic():
        chunk = (
            LearnerChunk.objects.select_for_update(of=("self",))
            .select_related("cluster")
            .filter(pk=chunk_id)
            .first()
        )
        if chunk is None or chunk.finished_at is not None:
            return chunk  # already finished (a duplicate): nothing is billed twice
        learner = (
            TrainingLearner.objects.select_for_update(of=("self",))
            .select_related("run")
            .get(pk=chunk.learner_id)
        )
        run = learner.run
        seconds = _billable_seconds(run=run, started_at=started_at, wall_seconds=wall_seconds)
        chunk.finished_at = finished_at
        chunk.steps = outcome.steps
        chunk.tokens = outcome.tokens
        chunk.train_losses = [round(x, 5) for x in outcome.losses]
        chunk.deltas_pushed = outcome.deltas_pushed
        chunk.bytes_sent = outcome.bytes_sent
        chunk.accelerator_seconds = Decimal(str(round(seconds, 3)))
        chunk.progress_at = finished_at
        chunk.error = error[:5000]
        chunk.save()
        _bill_chunk(chunk=chunk, learner=learner, occurred_at=finished_at)
        current = learner.generation == chunk.generation
        learner.tokens += outcome.tokens
        learner.steps += outcome.steps
        fields = ["tokens", "steps"]
        if current:
            learner.last_report_at = finished_at
            fields.append("last_report_at")
            if error and learner.state in (TrainingLearner.State.PLACED, TrainingLearner.State.RUNNING):
                learner.state = TrainingLearner.State.LOST
                learner.state_changed_at = finished_at
                learner.last_error = f"chunk {chunk.seq} failed: {error}"[:5000]
                fields += ["state", "state_changed_at", "last_error"]
        learner.save(update_fields=fields)
        if error and current:
            failures = LearnerChunk.objects.filter(learner=learner).exclude(error="")
            failures = failures.exclude(error__startswith="lost:").exclude(error__startswith="not billed:")
            if failures.count() >= MAX_CHUNK_FAILURES:
                # The same learner failing on every cluster it is moved to is a bug or bad data,
                # not a cluster problem: stop instead of failing over forever.
                why = f"learner {learner.index} failed {MAX_CHUNK_FAILURES} chunks; last: {error}"
                training_run_fail(run_id=run.pk, reason=why)
        if current and not error and chunk.steps > 0:
            event = selectors.learner_open_failover(learner=learner)
            if event is not None and chunk.generation > 0:
                # Recovered when the re-placed learner finished its first inner step again.
                back = getattr(outcome, "first_step_at", None) or started_at
                failover_event_recover(event=event, recovered_at=back, to_cluster=chunk.cluster)
        if (
            current
            and not error
            and not outcome.stopped_by
            and not _learner_stopped(learner, run, chunk.generation)
        ):
            _enqueue_next_chunk(learner=learner, generation=chunk.generation, seq=chunk.seq + 1)
        if run.registered_model_id is not None:
            # Chunks that were still training when the run succeeded bill after it registered
            # its model; keep the model's training cost equal to the ledger.
            RegisteredModel.objects.filter(pk=run.registered_model_id).update(
                training_cost=selectors.run_spend(run_id=run.pk)
            )
    return chunk


MAX_CHUNK_FAILURES = 3


def training_run_fail(*, run_id: int, reason: str) -> TrainingRun | None:
    """Move a live run to `failed` (no-op when it already ended)."""
    run = TrainingRun.objects.filter(pk=run_id).first()
    if run is None or not _transition_quietly(run, TrainingRun.State.FAILED, reason=reason[:1000]):
        return run
    TrainingLearner.objects.filter(run=run).exclude(state=TrainingLearner.State.DONE).update(
        state=TrainingLearner.State.RELEASED, state_changed_at=run.state_changed_at
    )
    return run


def _enqueue_next_chunk(*, learner: TrainingLearner, generation: int, seq: int) -> None:
    if learner.cluster is None:
        return
    learner_id, slug = learner.pk, learner.cluster.slug
    transaction.on_commit(
        lambda: dispatch.learner_chunk_enqueue(
            learner_id=learner_id, generation=generation, seq=seq, cluster_slug=slug
        )
    )


# --- Syncer -------------------------------------------------------------------------------------

SYNCER_TICK_SECONDS = 0.5
# A syncer chain that has not ticked for this long is presumed dead (its control worker was
# killed, its message lost); the supervisor starts a new chain.
SYNCER_STALE_SECONDS = 15.0


def syncer_tick_claim(*, run_id: int, token: str) -> TrainingRun | None:
    """The run, if this tick's chain is the current one and the run is live; else None (a no-op)."""
    now = timezone.now()
    updated = TrainingRun.objects.filter(
        pk=run_id, syncer_token=token, state__in=[TrainingRun.State.RUNNING, TrainingRun.State.RECOVERING]
    ).update(syncer_seen_at=now)
    if updated != 1:
        return None
    return TrainingRun.objects.get(pk=run_id)


def syncer_tick_continue(*, run_id: int, token: str) -> None:
    if TrainingRun.objects.filter(
        pk=run_id, syncer_token=token, state__in=[TrainingRun.State.RUNNING, TrainingRun.State.RECOVERING]
    ).exists():
        dispatch.syncer_tick_enqueue(run_id=run_id, token=token, countdown=SYNCER_TICK_SECONDS)


def syncer_restart(*, run: TrainingRun) -> str:
    """Start a new syncer chain (the old one, if it still runs, stops at its next tick)."""
    token = uuid.uuid4().hex
    TrainingRun.objects.filter(pk=run.pk).update(syncer_token=token, syncer_seen_at=timezone.now())
    run_id = run.pk
    transaction.on_commit(lambda: dispatch.syncer_tick_enqueue(run_id=run_id, token=token))
    return token


def global_versions_record_missing(
    *,
    run: TrainingRun,
    engine: Any,
    transport: Any,
    at_hand: dict[tuple[int, int], Any] | None = None,
    newest: dict[str, Any] | None = None,
    delta_bytes: dict[str, int] | None = None,
) -> list[GlobalVersionRecord]:
    """Record each published version the database lacks, exactly once (unique per run/fragment/version).

    The eval loss is that of the global parameters right after the version: the version's own
    fragment with every other fragment at its newest version. The caller may hand over what it
    already holds (the versions it just published, the syncer's current parameters, the sizes
    of the deltas it merged) so that nothing is read back from the store twice.
    """
    known: dict[int, set[int]] = {}
    for f, v in GlobalVersionRecord.objects.filter(run=run).values_list("fragment", "version"):
        known.setdefault(f, set()).add(v)
    missing = [
        (f, v)
        for f in range(len(engine.fragments))
        for v in transport.versions(f)
        if v not in known.get(f, set())
    ]
    if not missing:
        return []
    if newest is None:
        newest, _, _ = newest_global(transport, engine.fragments)
    at_hand = at_hand or {}
    sizes = delta_bytes or {}
    p = max(1, len(engine.fragments))
    made = []
    for f, v in sorted(missing, key=lambda fv: (fv[1], fv[0])):
        version = at_hand.get((f, v)) or transport.get_version(f, v)
        params = {**newest, **version.params}
        loss = engine.evaluate(params)
        bytes_in = 0
        for delta_id in version.merged:
            if delta_id in sizes:
                bytes_in += sizes[delta_id]
                continue
            try:
                bytes_in += transport.get_delta(f, delta_id).nbytes
            except Exception:  # a delta removed from the store: count what is left
                logger.warning("run %s: delta %s of f%s v%s is gone", run.pk, delta_id, f, v)
        at_epoch = float(version.meta.get("time") or 0.0)
        now = timezone.now()
        published_at = datetime.fromtimestamp(at_epoch, tz=UTC) if at_epoch > 0 else (run.started_at or now)
        tokens = int(version.meta.get("tokens", 0))
        with transaction.atomic():
            merged_before = (
                GlobalVersionRecord.objects.filter(run=run).aggregate(t=Sum("tokens_merged"))["t"] or 0
            )
            record, created = GlobalVersionRecord.objects.get_or_create(
                run=run,
                fragment=f,
                version=v,
                defaults={
                    "published_at": published_at,
                    "eval_loss": loss,
                    "tokens_merged": tokens,
                    # Each fragment's version counts the same tokens: the model saw 1/P of the sum.
                    "tokens_total": (merged_before + tokens) // p,
                    "learners_merged": list(version.meta.get("learners", [])),
                    "staleness": list(version.meta.get("staleness", [])),
                    "bytes_in": bytes_in,
                    "cost_so_far": selectors.run_spend(run_id=run.pk),
                    "wall_seconds": (published_at - run.started_at).total_seconds()
                    if run.started_at
                    else 0.0,
                },
            )
        if created:
            made.append(record)
    return made


def training_run_check_stop(*, run: TrainingRun) -> TrainingRun:
    """Finish the run when its stop condition holds, or stop it when its money budget is spent."""
    run.refresh_from_db()
    if run.state not in (TrainingRun.State.RUNNING, TrainingRun.State.RECOVERING):
        return run
    rc = RunConfig(run.config)
    if run.money_budget is not None and selectors.run_spend(run_id=run.pk) >= run.money_budget:
        return training_run_budget_exhaust(run=run)
    records = GlobalVersionRecord.objects.filter(run=run)
    done = False
    if rc.outer_steps is not None:
        newest = dict(records.values_list("fragment").annotate(v=Max("version")).values_list("fragment", "v"))
        done = len(newest) == rc.fragment_count and all(v >= rc.outer_steps for v in newest.values())
        why = f"{rc.outer_steps} outer steps on every fragment"
    else:
        total = records.aggregate(t=Max("tokens_total"))["t"] or 0
        done = rc.token_budget is not None and total >= rc.token_budget
        why = f"token budget {rc.token_budget} merged"
    if done:
        return training_run_succeed(run=run, why=why)
    return run


def training_run_succeed(*, run: TrainingRun, why: str) -> TrainingRun:
    """Write the final artifact, register it as a model and move the run to `succeeded`."""
    uri, loss, n_params, versions = write_artifact(run, kind="final")
    with transaction.atomic():
        locked = TrainingRun.objects.select_for_update().get(pk=run.pk)
        if locked.state not in (TrainingRun.State.RUNNING, TrainingRun.State.RECOVERING):
            return locked
        rc = RunConfig(run.config)
        slug = slugify(f"run-{run.pk}-{run.name}")[:64].strip("-") or f"run-{run.pk}"
        model, _ = RegisteredModel.objects.get_or_create(
            slug=slug,
            defaults={
                "family": "gpt-byte",
                "parameter_count": n_params,
                "artifact_uri": uri,
                "produced_by_run_id": run.pk,
                "final_eval_loss": loss,
                "training_cost": selectors.run_spend(run_id=run.pk),
                "tokenizer": "bytes",
                "context_length": rc.model_config().block_size,
            },
        )
        TrainingRun.objects.filter(pk=run.pk).update(
            registered_model=model, final_eval_loss=loss, artifact_uri=uri
        )
        run.registered_model, run.final_eval_loss, run.artifact_uri = model, loss, uri
        run.transition(TrainingRun.State.SUCCEEDED, reason=f"{why}; versions {versions}; model {slug}")
        TrainingLearner.objects.filter(run=run).exclude(state=TrainingLearner.State.LOST).update(
            state=TrainingLearner.State.DONE, state_changed_at=run.state_changed_at
        )
        TrainingLearner.objects.filter(run=run, state=TrainingLearner.State.LOST).update(
            state=TrainingLearner.State.RELEASED, state_changed_at=run.state_changed_at
        )
    return run


def training_run_budget_exhaust(*, run: TrainingRun) -> TrainingRun:
    """The money budget is spent: stop cleanly, keeping the last published version as a checkpoint."""
    spent = selectors.run_spend(run_id=run.pk)
    if not _transition_quietly(
        run,
        TrainingRun.State.BUDGET_EXHAUSTED,
        reason=f"money budget {run.money_budget} {run.currency} spent ({spent})",
    ):
        return run
    TrainingLearner.objects.filter(run=run).exclude(state=TrainingLearner.State.DONE).update(
        state=TrainingLearner.State.RELEASED, state_changed_at=run.state_changed_at
    )
    try:
        uri, loss, _, _ = write_artifact(run, kind="checkpoint")
    except Exception:
        logger.exception("run %s: checkpoint artifact not written", run.pk)
        return run
    TrainingRun.objects.filter(pk=run.pk).update(artifact_uri=uri, final_eval_loss=loss)
    run.artifact_uri, run.final_eval_loss = uri, loss
    return run


# --- Supervision and failover -----------------------------------------------------------------

PLACEMENT_RETRY_SECONDS = 60.0


def training_runs_supervise(*, now: datetime | None = None) -> dict[str, int]:
    """Beat's periodic check of live runs: restart a silent syncer, fail lost learners over."""
    now = now or timezone.now()
    counts = {"runs": 0, "syncers_restarted": 0, "failovers": 0}
    stuck = TrainingRun.objects.filter(
        state__in=[TrainingRun.State.PENDING, TrainingRun.State.PLACING],
        state_changed_at__lt=now - timedelta(seconds=PLACEMENT_RETRY_SECONDS),
    ).values_list("pk", flat=True)
    for run_id in stuck:
        # The placement task was lost or its worker died: placing again is idempotent.
        dispatch.training_run_place_enqueue(run_id=run_id)
    for run in selectors.training_runs_live():
        counts["runs"] += 1
        rc = RunConfig(run.config)
        seen = run.syncer_seen_at
        if seen is None or (now - seen).total_seconds() > SYNCER_STALE_SECONDS:
            with transaction.atomic():
                syncer_restart(run=run)
            counts["syncers_restarted"] += 1
        for learner in TrainingLearner.objects.filter(run=run).select_related("cluster"):
            reason = _lost_reason(learner=learner, rc=rc, now=now)
            if reason:
                counts["failovers"] += learner_failover(learner_id=learner.pk, reason=reason, now=now)
        run.refresh_from_db()
        lost = selectors.run_has_open_failovers(run=run)
        if run.state == TrainingRun.State.RUNNING and lost:
            _transition_quietly(run, TrainingRun.State.RECOVERING, reason="learners lost; re-placing")
        elif run.state == TrainingRun.State.RECOVERING and not lost:
            _transition_quietly(run, TrainingRun.State.RUNNING, reason="every learner is training again")
    return counts


def _lost_reason(*, learner: TrainingLearner, rc: RunConfig, now: datetime) -> str:
    if learner.state == TrainingLearner.State.LOST:
        return learner.last_error or "lost"
    if learner.state not in (TrainingLearner.State.PLACED, TrainingLearner.State.RUNNING):
        return ""
    cluster = learner.cluster
    if cluster is not None and cluster.status in (Cluster.Status.DOWN, Cluster.Status.DRAINING):
        return f"cluster {cluster.slug} is {cluster.status}"
    inflight = selectors.learner_inflight_chunk(learner=learner)
    marks = [learner.state_changed_at, learner.last_report_at]
    if inflight is not None:
        marks += [inflight.started_at, inflight.progress_at]
    last = max(m for m in marks if m is not None)
    silent = (now - last).total_seconds()
    if silent > rc.learner_timeout:
        return f"no report for {silent:.0f}s (learner_timeout {rc.learner_timeout:.0f}s)"
    return ""


def learner_failover(*, learner_id: int, reason: str, now: datetime) -> int:
    """Record a lost learner and re-place it on the cheapest healthy cluster with room.

    One FailoverEvent per loss episode: from the first loss until the learner trains again
    (its first inner step on the new cluster closes the event). Losing it again on the way
    (the new cluster dies too) moves it on under the same open event.

    Returns 1 when a FailoverEvent was written (the first time the learner is seen lost),
    else 0. The event's tokens_lost are the tokens trained since the learner's last delta
    reached the store; extra_cost is what those tokens cost at the learner's throughput and
    its cluster's price. When nothing fits, the learner stays lost and the next supervision
    tries again (a cluster that comes back becomes eligible again).
    """
    written = 0
    with transaction.atomic():
        learner = (
            TrainingLearner.objects.select_for_update(of=("self",))
            .select_related("run", "cluster")
            .filter(pk=learner_id)
            .first()
        )
        if learner is None:
            return 0
        run = learner.run
        if run.state not in (TrainingRun.State.RUNNING, TrainingRun.State.RECOVERING):
            return 0
        rc = RunConfig(run.config)
        event = selectors.learner_open_failover(learner=learner)
        from_cluster = learner.cluster
        if learner.state != TrainingLearner.State.LOST or (event is None and from_cluster is not None):
            tokens_lost, extra_cost = _close_lost_chunks(learner=learner, reason=reason, now=now)
            learner.state = TrainingLearner.State.LOST
            learner.state_changed_at = now
            learner.last_error = reason[:5000]
            learner.save(update_fields=["state", "state_changed_at", "last_error"])
        else:
            tokens_lost, extra_cost = 0, Decimal("0")
        result = place(
            learners=[learner.index],
            options=selectors.cluster_options(at=now),
            constraints=Constraints(
                accelerator_type=rc.raw["placement"]["accelerator_type"],
                regions=tuple(rc.raw["placement"]["regions"]),
            ),
            avoid=frozenset({from_cluster.pk}) if from_cluster is not None else frozenset(),
        )
        assignment = result.assignments[0] if result.assignments else None
        to_cluster = Cluster.objects.get(pk=assignment.option.cluster_id) if assignment else None
        if event is None and from_cluster is not None:
            event = failover_event_record(
                kind=FailoverEvent.Kind.TRAINING,
                reason=f"learner {learner.index}: {reason}"
                + ("" if to_cluster else f"; not re-placed yet: {'; '.join(result.problems)}"),
                detected_at=now,
                from_cluster=from_cluster,
                to_cluster=to_cluster,
                subject=selectors.learner_failover_subject(run_id=run.pk, index=learner.index),
                extra_cost=extra_cost,
                currency=run.currency,
                training_run_id=run.pk,
                tokens_lost=tokens_lost,
                details={"learner": learner.index, "generation": learner.generation},
            )
            written = 1
        if assignment is None or to_cluster is None:
            return written
        learner.generation += 1
        learner.cluster = to_cluster
        learner.state = TrainingLearner.State.PLACED
        learner.state_changed_at = now
        learner.save(update_fields=["generation", "cluster", "state", "state_changed_at"])
        reason_kind = (
            PlacementDecision.Reason.FAILOVER
            if from_cluster is not None
            else PlacementDecision.Reason.INITIAL
        )
        _decision(
            run=run,
            index=learner.index,
            generation=learner.generation,
            assignment=assignment,
            result=result,
            reason=reason_kind,
            now=now,
        )
        learner_pk, generation, slug = learner.pk, learner.generation, to_cluster.slug
        transaction.on_commit(
            lambda: dispatch.learner_chunk_enqueue(
                learner_id=learner_pk, generation=generation, seq=0, cluster_slug=slug
            )
        )
    return written


def _close_lost_chunks(*, learner: TrainingLearner, reason: str, now: datetime) -> tuple[int, Decimal]:
    """Finish the lost learner's unfinished chunks and bill the time their worker held the slot.

    A killed worker cannot say how far it got after its last push. It was alive, and holding
    its accelerators, until its last heartbeat (WorkerHeartbeat of the chunk's worker), so the
    chunk is closed and billed up to then; the tokens it trained after its last push are
    estimated from the learner's measured throughput (tokens per accelerator-second so far).
    Returns (tokens lost since the last delta reached the store, what that time cost).
    """
    done = LearnerChunk.objects.filter(learner=learner, finished_at__isnull=False).aggregate(
        s=Sum("accelerator_seconds"), t=Sum("tokens")
    )
    rate = float(done["t"]) / float(done["s"]) if done["t"] and done["s"] else 0.0
    unreported_tokens = 0
    lost_seconds = 0.0
    for chunk in (
        LearnerChunk.objects.select_for_update()
        .select_related("cluster")
        .filter(learner=learner, finished_at__isnull=True)
    ):
        reported = chunk.progress_at or chunk.started_at
        seen = (
            WorkerHeartbeat.objects.filter(cluster=chunk.cluster, hostname=chunk.worker_hostname)
            .values_list("last_seen_at", flat=True)
            .first()
        )
        end = min(max(reported, seen), now) if seen is not None else reported
        chunk.finished_at = end
        chunk.accelerator_seconds = Decimal(str(round(max(0.0, (end - chunk.started_at).total_seconds()), 3)))
        chunk.error = f"lost: {reason}"[:5000]
        chunk.save(update_fields=["finished_at", "accelerator_seconds", "error"])
        _bill_chunk(chunk=chunk, learner=learner, occurred_at=end)
        learner.tokens += chunk.tokens
        learner.steps += chunk.steps
        if chunk.generation == learner.generation:
            unreported_tokens += int(rate * (end - reported).total_seconds())
    learner.save(update_fields=["tokens", "steps"])
    tokens_lost = max(0, learner.tokens - learner.tokens_at_last_push) + unreported_tokens
    if rate > 0:
        lost_seconds = tokens_lost / rate
    extra = Decimal("0")
    if learner.cluster is not None and lost_seconds > 0:
        price = price_in_force(
            unit=Unit.ACCELERATOR_HOUR, at=now, cluster=learner.cluster, provider=learner.cluster.provider
        )
        if price is not None:
            accelerators = selectors.accelerators_per_learner(learner.cluster)
            extra = (
                Decimal(str(round(lost_seconds, 3))) / SECONDS_PER_HOUR * accelerators * price.unit_price
            ).quantize(Decimal("0.000000001"))
    return tokens_lost, extra
