"""Learner chunks: claiming one, recording its progress and outcome, billing it, chaining the next."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from billing.resource_bills import accelerator_time_bill
from billing.services import NoPriceError
from registry.models import Cluster, RegisteredModel, WorkerHeartbeat
from registry.services import failover_event_recover
from training import dispatch, selectors
from training.models import LearnerChunk, TrainingLearner, TrainingRun
from training.run_config import RunConfig
from training.services.runs import training_run_budget_exhaust, training_run_fail
from training.services.transfers import chunk_egress_bill

logger = logging.getLogger(__name__)

# A learner whose chunks failed this often (on whatever clusters) stops the run.
MAX_CHUNK_FAILURES = 3
# How a chunk's stop reason starts when its cluster is under a spot interruption notice: the
# chunk pushes its delta and stops, and the learner is moved (training.services.supervision).
INTERRUPTED = "interrupted: "
BUDGET_REACHED = "money budget reached"  # a chunk's stop reason (learner_chunk_budget_deadline)
BUDGET_SLACK_SECONDS = 1  # of a chunk's time: a budget with less left than this is spent


def cluster_interruption_reason(cluster: Cluster) -> str:
    """Why no learner may train on `cluster` now because it is being reclaimed ("" when it is not)."""
    if not cluster.interrupted:
        return ""
    deadline = cluster.interruption_deadline
    when = f" at {deadline:%Y-%m-%d %H:%M:%S} UTC" if deadline is not None else ""
    return f"{INTERRUPTED}cluster {cluster.slug} is reclaimed{when} (spot interruption notice)"


class DevicesBusy(Exception):  # noqa: N818 (a wait, not an error)
    """The devices the chunk needs are owned by its worker's other chunks: it waits (its task
    retries) rather than share a GPU with another learner."""


class TooFewDevices(Exception):  # noqa: N818 (a refusal, said on the learner)
    """The worker offers fewer devices than the run's learners.ranks: no wait would help."""


def _chunk_devices(
    *, learner: TrainingLearner, worker_hostname: str, ranks: int, redelivered: int | None
) -> list[int]:
    """The device ordinals the chunk owns while it runs: the first `ranks` its worker offers
    (registry.worker_signals) that no live chunk of that worker owns, or the ones the learner's
    previous chunk there owned if they are all free; [] on a worker that offers
    none (CPU). Live: unfinished, started since the worker's process started (a restarted worker
    owns nothing of its dead predecessor's), of its learner's current generation in a live run
    (a cancelled run's or a moved learner's chunk owns nothing). Chosen under a transaction lock
    of the worker's own (not a row lock, which the heartbeat's cluster lock could deadlock
    with), so chunks claimed at once on one worker (`--concurrency > 1`) get disjoint devices.
    DevicesBusy when too few are free now, TooFewDevices when the worker has too few at all."""
    hostname = worker_hostname[:255]
    _worker_lock(hostname)
    beat = WorkerHeartbeat.objects.filter(cluster=learner.cluster, hostname=hostname).first()
    if beat is None or not beat.devices:
        return []
    if len(beat.devices) < ranks:
        raise TooFewDevices(
            f"worker {hostname} offers {len(beat.devices)} device(s), fewer than learners.ranks ({ranks})"
        )
    others = LearnerChunk.objects.filter(
        worker_hostname=hostname,
        finished_at__isnull=True,
        started_at__gte=beat.started_at,
        generation=F("learner__generation"),
        learner__run__state__in=[TrainingRun.State.RUNNING, TrainingRun.State.RECOVERING],
    )
    if redelivered is not None:
        others = others.exclude(pk=redelivered)  # its own earlier attempt on this worker
    held = {d for owned in others.values_list("devices", flat=True) for d in owned}
    free = [d for d in beat.devices if d not in held]
    if len(free) < ranks:
        raise DevicesBusy(
            f"worker {hostname} offers devices {beat.devices}, of which {sorted(held)} are owned"
        )
    # The devices of the learner's previous chunk on this worker, when they are all free: its
    # rank group (training.engine.distributed) was kept on them, with its replicas in their memory.
    previous = (
        LearnerChunk.objects.filter(
            learner=learner,
            generation=learner.generation,
            worker_hostname=hostname,
            finished_at__isnull=False,
        )
        .order_by("-seq")
        .values_list("devices", flat=True)
        .first()
    )
    if previous and len(previous) == ranks and set(previous) <= set(free):
        return list(previous)
    return free[:ranks]


def _worker_lock(hostname: str) -> None:
    """Serialise device choices on one worker until the transaction ends (PostgreSQL; SQLite,
    the embedded demo, has one writer at a time already)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"switchyard-devices:{hostname}"])


@dataclass(frozen=True)
class ChunkClaim:
    run: TrainingRun
    learner: TrainingLearner
    chunk: LearnerChunk


@dataclass
class ChunkOutcome:
    """What a chunk did (training.orchestrator fills it in as it trains)."""

    steps: int = 0
    tokens: int = 0
    losses: list[float] = field(default_factory=list)
    deltas_pushed: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    state_source: str = ""  # LearnerChunk.StateSource: where the learner's state came from
    checkpoint_key: str = ""  # the checkpoint it was restored from, if any
    stopped_by: str = ""  # "" (time up) or the run/learner state that stopped it
    stopped_at: float | None = None  # wall time the stop was seen
    first_step_at: datetime | None = None  # when the first inner step finished (training again)
    ranks_start: str = ""  # LearnerChunk.RankStart: how its other ranks came ("" for one rank)
    ranks_start_seconds: float | None = None
    checkpoint_bytes: int = 0  # the checkpoint it wrote at its end
    checkpoint_moved_bytes: int = 0  # the checkpoint copied in from another cluster's store
    checkpoint_moved_from_id: int | None = None  # that cluster (None: the installation's store)


def _learner_stopped(learner: TrainingLearner, run: TrainingRun, generation: int) -> str:
    """Why this generation of the learner must not train ("" when it may)."""
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
    died: it starts over on this worker. A spent money budget, or a spent hard budget of the
    run's team or of the run, stops the run here, before anything more is trained or billed. A
    cluster that may not be used any more (a spent hard budget of the cluster or its provider, a
    spot interruption notice) starts nothing: the learner is marked lost, saying why, and the
    supervisor moves it.
    """
    now = timezone.now()
    exhausted_run: TrainingRun | None = None
    exhausted_why = ""  # "" with exhausted_run: the run's own money budget
    # Not a registry.claims conditional UPDATE: the claim reads the chunk, the run's budgets and
    # the cluster and then picks one of several outcomes (chain on, stop the run, mark the
    # learner lost, start or restart the chunk), so it holds the learner's row lock across them.
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
        elif (exhausted_why := selectors.run_budget_refusal(run=run)) != "":
            exhausted_run = run
        elif moved := _cluster_refusal(learner=learner):
            # Not here: the learner is lost with the reason, and the supervisor re-places it on a
            # cluster that may still spend (its state is in the previous chunk's checkpoint).
            TrainingLearner.objects.filter(pk=learner.pk).update(
                state=TrainingLearner.State.LOST, state_changed_at=now, last_error=moved[:5000]
            )
            return None
        else:
            ranks = RunConfig(run.config).ranks
            try:
                devices = _chunk_devices(
                    learner=learner,
                    worker_hostname=worker_hostname,
                    ranks=ranks,
                    redelivered=existing.pk if existing is not None else None,
                )
            except TooFewDevices as exc:
                # Not here: the learner is lost, saying why, and the supervisor moves it.
                TrainingLearner.objects.filter(pk=learner.pk).update(
                    state=TrainingLearner.State.LOST, state_changed_at=now, last_error=str(exc)[:5000]
                )
                return None
            if existing is None:
                chunk = LearnerChunk.objects.create(
                    learner=learner,
                    generation=generation,
                    seq=seq,
                    cluster=learner.cluster,
                    # The devices the chunk runs on (its ranks), not the whole learner slot.
                    accelerators=ranks,
                    devices=devices,
                    worker_hostname=worker_hostname[:255],
                    started_at=now,
                    progress_at=now,
                )
            else:
                chunk = existing
                LearnerChunk.objects.filter(pk=chunk.pk).update(
                    worker_hostname=worker_hostname[:255],
                    devices=devices,
                    started_at=now,
                    progress_at=now,
                    steps=0,
                    tokens=0,
                )
                chunk.refresh_from_db()
            TrainingLearner.objects.filter(pk=learner.pk).update(
                state=TrainingLearner.State.RUNNING, worker_hostname=worker_hostname[:255]
            )
            learner.state = TrainingLearner.State.RUNNING
    if exhausted_run is not None:
        training_run_budget_exhaust(run=exhausted_run, why=exhausted_why)
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
    bytes_received: int = 0,
) -> None:
    """A chunk pushed deltas: record how far it got (a killed chunk leaves this behind)."""
    now = timezone.now()
    chunk = LearnerChunk.objects.filter(pk=chunk_id, finished_at__isnull=True)
    chunk.update(
        steps=steps,
        tokens=tokens,
        deltas_pushed=deltas_pushed,
        bytes_sent=bytes_sent,
        bytes_received=bytes_received,
        progress_at=now,
    )
    TrainingLearner.objects.filter(pk=learner_id).update(tokens_at_last_push=tokens_at_push, last_push_at=now)


def _cluster_refusal(*, learner: TrainingLearner) -> str:
    """Why the learner's next chunk may not run on its cluster ("" when it may)."""
    cluster = learner.cluster
    if cluster is None:
        return ""
    interrupted = cluster_interruption_reason(cluster)
    if interrupted:
        return interrupted
    why = selectors.cluster_budget_refusal(cluster=cluster)
    return f"cluster {cluster.slug}: {why}" if why else ""


def learner_chunk_should_stop(*, learner_id: int, generation: int) -> str:
    """Why a running chunk must stop now ("" to go on): the run ended, the learner moved, or its
    cluster got a spot interruption notice (the reason then starts with INTERRUPTED)."""
    learner = TrainingLearner.objects.select_related("run", "cluster").filter(pk=learner_id).first()
    if learner is None:
        return "learner gone"
    stopped = _learner_stopped(learner, learner.run, generation)
    if stopped or learner.cluster is None:
        return stopped
    return cluster_interruption_reason(learner.cluster)


def learner_chunk_budget_deadline(*, run_id: int) -> float | None:
    """When (epoch seconds) a running chunk of the run must stop because the run's money budget
    is then spent at the rate the run spends now (selectors.run_budget_deadline); None: never.
    The chunk stops saying BUDGET_REACHED, writes its checkpoint, is billed, and the run ends
    budget_exhausted (training_run_check_stop)."""
    run = TrainingRun.objects.filter(pk=run_id).first()
    at = selectors.run_budget_deadline(run=run, now=timezone.now()) if run is not None else None
    return at.timestamp() if at is not None else None


def training_run_budget_reached(run: TrainingRun, chunk_id: int) -> bool:
    """Chunk `chunk_id` stopped with BUDGET_REACHED and was billed: the run ends budget_exhausted
    with a checkpoint when what its budget still allows is at most BUDGET_SLACK_SECONDS of that
    chunk's time (the billed seconds may come out a hair under the projection); otherwise it
    goes on (another learner's chunk ended meanwhile, say) and its next chunk checks again.
    True when the run has ended (this worker then frees the run's engine)."""
    run.refresh_from_db()
    if run.state not in (TrainingRun.State.RUNNING, TrainingRun.State.RECOVERING):
        return run.is_finished
    now = timezone.now()
    position = selectors.run_budget_left(run=run, now=now)
    chunk = LearnerChunk.objects.select_related("cluster").get(pk=chunk_id)
    per_second = selectors.chunk_price_per_second(chunk, at=now) or Decimal(0)
    if position is None or position[0] > per_second * BUDGET_SLACK_SECONDS:
        return False
    spent = selectors.run_spend(run_id=run.pk)
    why = selectors.run_budget_refusal(run=run)  # a hard budget the chunk's bill used up
    if (
        not why
        and run.money_budget is not None
        and spent >= run.money_budget - per_second * BUDGET_SLACK_SECONDS
    ):
        why = f"money budget {run.money_budget} {run.currency} spent ({spent}; stopped inside a chunk at its rate)"
    if not why:
        why = f"a hard budget of the run or its team reached at the run's rate (the run spent {spent})"
    return training_run_budget_exhaust(run=run, why=why).is_finished


def _billable_seconds(*, run: TrainingRun, started_at: datetime, wall_seconds: float) -> float:
    """Seconds to bill: all of them, except that nothing after a run's end is billed."""
    if run.is_finished and run.finished_at is not None:
        return max(0.0, min(wall_seconds, (run.finished_at - started_at).total_seconds()))
    return max(0.0, wall_seconds)


def learner_chunk_bill(*, chunk: LearnerChunk, learner: TrainingLearner, occurred_at: datetime) -> bool:
    """Bill a closed chunk's accelerator time once (its billing key); False when nothing was billed."""
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
                team=learner.run.team_slug,
                idempotency_key=chunk.billing_key,
                at=occurred_at,
                description=(
                    f"training run #{learner.run_id} learner {learner.index} g{chunk.generation} "
                    f"chunk {chunk.seq}: {chunk.accelerator_seconds:.3f}s × {chunk.accelerators} on {chunk.cluster.slug}"
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
    outcome: ChunkOutcome,
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
        chunk.bytes_received = outcome.bytes_received
        chunk.state_source = outcome.state_source
        chunk.checkpoint_key = outcome.checkpoint_key[:500]
        chunk.ranks_start = outcome.ranks_start
        chunk.ranks_start_seconds = outcome.ranks_start_seconds
        chunk.checkpoint_bytes = outcome.checkpoint_bytes
        chunk.checkpoint_moved_bytes = outcome.checkpoint_moved_bytes
        chunk.checkpoint_moved_from_id = outcome.checkpoint_moved_from_id
        chunk.accelerator_seconds = Decimal(str(round(seconds, 3)))
        chunk.progress_at = finished_at
        chunk.error = error[:5000]
        chunk.stopped_by = outcome.stopped_by[:200]
        chunk.save()
        learner_chunk_bill(chunk=chunk, learner=learner, occurred_at=finished_at)
        chunk_egress_bill(chunk=chunk, learner=learner, occurred_at=finished_at)
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
            elif outcome.stopped_by.startswith(INTERRUPTED) and learner.state in (
                TrainingLearner.State.PLACED,
                TrainingLearner.State.RUNNING,
            ):
                # Interrupted, not failed: the chunk pushed its delta and wrote its checkpoint, so
                # the supervisor's move loses nothing, and the failure count is not raised.
                learner.state = TrainingLearner.State.LOST
                learner.state_changed_at = finished_at
                learner.last_error = outcome.stopped_by[:5000]
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
                back = outcome.first_step_at or started_at
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


def _enqueue_next_chunk(*, learner: TrainingLearner, generation: int, seq: int) -> None:
    """The learner's next chunk on its cluster's queue, once this transaction commits."""
    if learner.cluster is None:
        return
    learner_id, slug = learner.pk, learner.cluster.slug
    transaction.on_commit(
        lambda: dispatch.learner_chunk_enqueue(
            learner_id=learner_id, generation=generation, seq=seq, cluster_slug=slug
        )
    )
