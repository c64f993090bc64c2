"""Supervision of live runs (beat): stuck placements, silent syncers, learner failover (also off a
cluster under a spot interruption notice, or one whose hard budget is spent), and runs that hard
budgets leave without a cluster."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from billing.models import Unit
from billing.selectors import price_in_force
from billing.services import SECONDS_PER_HOUR
from registry.failover_codes import FailoverCode
from registry.models import Cluster, FailoverEvent, WorkerHeartbeat
from registry.services import failover_event_record
from training import dispatch, selectors
from training.models import GlobalVersionRecord, LearnerChunk, PlacementDecision, TrainingLearner, TrainingRun
from training.placement import Constraints, place
from training.run_config import RunConfig
from training.services.chunks import INTERRUPTED, cluster_interruption_reason, learner_chunk_bill
from training.services.evaluation import versions_evaluate_send
from training.services.placing import placement_decision_record
from training.services.runs import training_run_budget_exhaust, transition_quietly
from training.services.syncer import SYNCER_STALE_SECONDS, syncer_restart
from training.services.transfers import chunk_egress_bill

PLACEMENT_RETRY_SECONDS = 60.0
# A chunk on a cluster under a spot interruption notice sees it within a second (its stop check)
# and then pushes its delta and stops; it gets this long (or until the deadline, if sooner) to do
# so before the supervisor moves its learner the hard way (its chunk closed as lost).
INTERRUPTION_STOP_SECONDS = 10.0


def training_runs_supervise(*, now: datetime | None = None) -> dict[str, int]:
    """Beat's periodic check of live runs: restart a silent syncer, fail lost learners over; and
    of every run, send an evaluator where versions wait with none holding the run."""
    now = now or timezone.now()
    counts = {"runs": 0, "syncers_restarted": 0, "failovers": 0, "evaluators_sent": 0}
    stuck = TrainingRun.objects.filter(
        state__in=[TrainingRun.State.PENDING, TrainingRun.State.PLACING],
        state_changed_at__lt=now - timedelta(seconds=PLACEMENT_RETRY_SECONDS),
    ).values_list("pk", flat=True)
    for run_id in stuck:
        # The placement task was lost or its worker died: placing again is idempotent.
        dispatch.training_run_place_enqueue(run_id=run_id)
    # Versions still to evaluate whose evaluator's hold lapsed (its task lost, its worker dead),
    # of any run, finished ones too: no syncer tick will send another for those.
    waiting = (
        GlobalVersionRecord.objects.filter(eval_loss__isnull=True, eval_note="")
        .filter(Q(run__evaluator_until__isnull=True) | Q(run__evaluator_until__lt=now))
        .values_list("run_id", flat=True)
        .distinct()
    )
    for run in TrainingRun.objects.filter(pk__in=list(waiting)):
        counts["evaluators_sent"] += versions_evaluate_send(run)
    for run in selectors.training_runs_live():
        counts["runs"] += 1
        rc = RunConfig(run.config)
        seen = run.syncer_seen_at
        if seen is None or (now - seen).total_seconds() > SYNCER_STALE_SECONDS:
            with transaction.atomic():
                syncer_restart(run=run)
            counts["syncers_restarted"] += 1
        refusal = selectors.run_budget_refusal(run=run)
        if refusal:
            # The team's or the run's own hard budget: no cluster may spend for it.
            training_run_budget_exhaust(run=run, why=refusal)
            continue
        for learner in TrainingLearner.objects.filter(run=run).select_related("cluster"):
            code, reason = _lost_reason(learner=learner, rc=rc, now=now)
            if reason:
                counts["failovers"] += learner_failover(
                    learner_id=learner.pk, reason=reason, now=now, code=code
                )
        run.refresh_from_db()
        why = _no_cluster_within_budget(run=run, rc=rc, now=now)
        if why:
            training_run_budget_exhaust(run=run, why=why)
            continue
        lost = selectors.run_has_open_failovers(run=run)
        if run.state == TrainingRun.State.RUNNING and lost:
            transition_quietly(run, TrainingRun.State.RECOVERING, reason="learners lost; re-placing")
        elif run.state == TrainingRun.State.RECOVERING and not lost:
            transition_quietly(run, TrainingRun.State.RUNNING, reason="every learner is training again")
    return counts


def _lost_reason(*, learner: TrainingLearner, rc: RunConfig, now: datetime) -> tuple[FailoverCode, str]:
    """(failover code, reason) of a learner that must move; reason "" while it may stay."""
    if learner.state == TrainingLearner.State.LOST:
        reason = learner.last_error or "lost"
        return lost_learner_code(reason), reason
    if learner.state not in (TrainingLearner.State.PLACED, TrainingLearner.State.RUNNING):
        return FailoverCode.OTHER, ""
    cluster = learner.cluster
    inflight = selectors.learner_inflight_chunk(learner=learner)
    if cluster is not None and cluster.status in (Cluster.Status.DOWN, Cluster.Status.DRAINING):
        if inflight is not None and _stopping_for_interruption(cluster=cluster, now=now):
            return FailoverCode.PREEMPTION, ""  # its chunk is pushing its delta and stopping
        interrupted = cluster_interruption_reason(cluster)
        if interrupted:
            return FailoverCode.PREEMPTION, interrupted
        code = (
            FailoverCode.CLUSTER_DRAINING
            if cluster.status == Cluster.Status.DRAINING
            else FailoverCode.HEARTBEAT_TIMEOUT
        )
        return code, f"cluster {cluster.slug} is {cluster.status}"
    marks = [learner.state_changed_at, learner.last_report_at]
    if inflight is not None:
        marks += [inflight.started_at, inflight.progress_at]
    last = max(m for m in marks if m is not None)
    silent = (now - last).total_seconds()
    if silent > rc.learner_timeout:
        return (
            FailoverCode.WORKER_LOST,
            f"no report for {silent:.0f}s (learner_timeout {rc.learner_timeout:.0f}s)",
        )
    return FailoverCode.OTHER, ""


def lost_learner_code(reason: str) -> FailoverCode:
    """The code of a learner already marked lost, from the reason training's own code wrote
    (training.services.chunks: an interruption, a failed chunk, or a cluster budget refusal)."""
    if reason.startswith(INTERRUPTED):
        return FailoverCode.PREEMPTION
    if reason.startswith("chunk ") and " failed: " in reason:
        return FailoverCode.CHUNK_FAILED
    if reason.startswith("cluster ") and "budget" in reason:
        return FailoverCode.BUDGET_EXHAUSTED
    # A learner lost by an earlier supervision keeps that supervision's reason (_lost_reason).
    if reason.startswith("no report for "):
        return FailoverCode.WORKER_LOST
    if reason.startswith("cluster ") and reason.endswith(f" is {Cluster.Status.DOWN}"):
        return FailoverCode.HEARTBEAT_TIMEOUT
    if reason.startswith("cluster ") and reason.endswith(f" is {Cluster.Status.DRAINING}"):
        return FailoverCode.CLUSTER_DRAINING
    return FailoverCode.OTHER


def _stopping_for_interruption(*, cluster: Cluster, now: datetime) -> bool:
    """Whether chunks on this interrupted cluster are still within their time to push and stop."""
    noticed, deadline = cluster.interruption_noticed_at, cluster.interruption_deadline
    if not cluster.interrupted or noticed is None:
        return False
    until = noticed + timedelta(seconds=INTERRUPTION_STOP_SECONDS)
    if deadline is not None:
        until = min(until, deadline)
    return now < until


def _no_cluster_within_budget(*, run: TrainingRun, rc: RunConfig, now: datetime) -> str:
    """Why the run must stop because hard budgets leave it no cluster ("" otherwise).

    Only when none of its learners is placed or training, and placement would find a cluster for
    one of them if budgets were ignored: then budgets, not health or capacity, are what stops it
    (a cluster that is down may come back; a spent budget waits for the next period)."""
    if run.state not in (TrainingRun.State.RUNNING, TrainingRun.State.RECOVERING):
        return ""
    learners = TrainingLearner.objects.filter(run=run)
    if learners.filter(state__in=[TrainingLearner.State.PLACED, TrainingLearner.State.RUNNING]).exists():
        return ""
    lost = list(learners.filter(state=TrainingLearner.State.LOST).values_list("index", flat=True))
    if not lost:
        return ""
    options = selectors.cluster_options(at=now, team=run.team_slug, training_run_id=str(run.pk))
    blocked = [o for o in options if o.budget_refusal]
    if not blocked:
        return ""
    constraints = _failover_constraints(rc)
    unbudgeted = place(
        learners=lost, options=[replace(o, budget_refusal="") for o in options], constraints=constraints
    )
    if not unbudgeted.assignments:
        return ""
    return "no cluster left within budget: " + "; ".join(f"{o.slug}: {o.budget_refusal}" for o in blocked)


def _failover_constraints(rc: RunConfig) -> Constraints:
    return Constraints(
        accelerator_type=rc.raw["placement"]["accelerator_type"],
        regions=tuple(rc.raw["placement"]["regions"]),
        ranks=rc.ranks,
    )


def learner_failover(
    *, learner_id: int, reason: str, now: datetime, code: FailoverCode = FailoverCode.OTHER
) -> int:
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
            options=selectors.cluster_options(at=now, team=run.team_slug, training_run_id=str(run.pk)),
            constraints=_failover_constraints(rc),
            avoid=frozenset({from_cluster.pk}) if from_cluster is not None else frozenset(),
            # Moving its checkpoint to another store is paid once, as egress: weighed (rule 4).
            checkpoint=selectors.learner_checkpoint_at(run=run, index=learner.index, at=now),
            horizon_hours=settings.PLACEMENT_EGRESS_HORIZON_HOURS,
        )
        assignment = result.assignments[0] if result.assignments else None
        to_cluster = Cluster.objects.get(pk=assignment.option.cluster_id) if assignment else None
        if event is None and from_cluster is not None:
            event = failover_event_record(
                kind=FailoverEvent.Kind.TRAINING,
                code=code,
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
        placement_decision_record(
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
        learner_chunk_bill(chunk=chunk, learner=learner, occurred_at=end)
        chunk_egress_bill(chunk=chunk, learner=learner, occurred_at=end)  # the pushes it reported
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
            accelerators = RunConfig(learner.run.config).ranks  # the devices its chunks used
            extra = (
                Decimal(str(round(lost_seconds, 3))) / SECONDS_PER_HOUR * accelerators * price.unit_price
            ).quantize(Decimal("0.000000001"))
    return tokens_lost, extra
