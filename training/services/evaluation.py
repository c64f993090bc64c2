"""Version evaluation, off the control queue: the syncer records each global version at once
(training.services.syncer) and an evaluator on a cluster's queue fills in its eval loss.

Where: the run's `placement.eval_cluster` when it is live; else the live cluster of the run's
learners with the most accelerators, a GPU cluster before a CPU one; else (no cluster of the
run is live) the control queue, so that versions are still evaluated, with a warning. One
evaluator per run at a time: sending one takes the run's hold (TrainingRun.evaluator_until,
under a new evaluator_token). Each task evaluates versions for up to EVAL_TASK_SECONDS (one at
least), releases the hold and sends the next, so a learner's chunks queued on the same cluster
run between two tasks (a version's evaluation must stay well inside `learner_timeout` there,
or name an eval_cluster of its own).
A hold that lapses (a lost task, a dead worker) lets the next syncer tick, or beat for an ended
run, send another, to wherever is live then; the superseded one, if it still runs, finishes
its version and stops.

What: each version's eval loss is that of the global parameters right after it, the version's
own fragment with every other fragment at its newest version published no later (recorded
before it, or in the same tick), on the run's eval windows
(`eval_windows`, sampled once per run: the token budget is windows × block size), on CPU. The
versions a pending evaluation reads are pinned in the store until it is done (training.services.
retention). A version the store no longer holds, one whose evaluation failed MAX_EVAL_ATTEMPTS
times, and the oldest of more than EVAL_BACKLOG waiting are noted on their records and left
unevaluated.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import timedelta

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from registry.models import Cluster
from registry.queues import CONTROL_QUEUE, cluster_queue
from storage.objectstore import ObjectNotFoundError
from training import dispatch
from training.models import GlobalVersionRecord, TrainingLearner, TrainingRun
from training.run_config import RunConfig
from training.run_engines import run_engine, run_transport, version_params

logger = logging.getLogger(__name__)

# How long a sent evaluator holds the run before it starts, and then for the version it evaluates.
EVALUATOR_HOLD_SECONDS = 600.0
MAX_EVAL_ATTEMPTS = 3
# An evaluator task starts no version after this many seconds; the next task goes on.
EVAL_TASK_SECONDS = 5.0
# At most this many versions (or 2 × keep_versions) wait for evaluation; older ones are skipped.
EVAL_BACKLOG = 8
LIVE = (Cluster.Status.HEALTHY, Cluster.Status.DEGRADED)


def pending_evaluation(run: TrainingRun) -> list[GlobalVersionRecord]:
    """The run's recorded versions still to evaluate, oldest first."""
    rows = GlobalVersionRecord.objects.filter(run=run, eval_loss__isnull=True, eval_note="")
    return list(rows.order_by("published_at", "version", "fragment"))


def evaluation_versions(run: TrainingRun, record: GlobalVersionRecord, fragments: int) -> list[int]:
    """Per fragment, the version the record's evaluation reads: its own for its fragment, for
    every other the newest recorded version published no later than it (0 before any)."""
    versions = [0] * fragments
    earlier = GlobalVersionRecord.objects.filter(run=run, published_at__lte=record.published_at)
    for f, v in earlier.values_list("fragment", "version"):
        if f < fragments and v > versions[f]:
            versions[f] = v
    versions[record.fragment] = record.version
    return versions


def pinned_for_evaluation(run: TrainingRun, fragments: int) -> dict[int, set[int]]:
    """The versions the run's pending evaluations will read (retention keeps them)."""
    pinned: dict[int, set[int]] = {}
    for record in pending_evaluation(run):
        for f, v in enumerate(evaluation_versions(run, record, fragments)):
            pinned.setdefault(f, set()).add(v)
    return pinned


def _live(cluster: Cluster) -> bool:
    return cluster.status in LIVE and not cluster.heartbeat_overdue


def evaluator_queue(run: TrainingRun) -> tuple[str, str]:
    """(queue, cluster slug or "control") where the run's evaluator goes now (module docstring)."""
    named = RunConfig(run.config).eval_cluster
    if named is not None:
        cluster = Cluster.objects.filter(slug=named).first()
        if cluster is not None and _live(cluster):
            return cluster_queue(cluster.slug), cluster.slug
    ids = TrainingLearner.objects.filter(run=run).values_list("cluster_id", flat=True)
    own = [c for c in Cluster.objects.filter(pk__in=list(ids)).order_by("slug") if _live(c)]
    if own:
        best = max(own, key=lambda c: (c.accelerator_type.lower() != "cpu", c.accelerator_count))
        return cluster_queue(best.slug), best.slug
    return CONTROL_QUEUE, "control"


def versions_evaluate_send(run: TrainingRun) -> bool:
    """Send the run's evaluator if versions wait and no evaluator holds the run (the syncer's
    tick asks after recording, an evaluator after each version, beat for ended runs). Sending
    takes the hold under a new token, so one evaluator is in flight. Sent after the caller's
    transaction commits; True when one was sent."""
    if not GlobalVersionRecord.objects.filter(run=run, eval_loss__isnull=True, eval_note="").exists():
        return False
    now = timezone.now()
    queue, where = evaluator_queue(run)
    token = uuid.uuid4().hex
    taken = TrainingRun.objects.filter(
        Q(evaluator_until__isnull=True) | Q(evaluator_until__lt=now), pk=run.pk
    ).update(
        evaluator_until=now + timedelta(seconds=EVALUATOR_HOLD_SECONDS),
        evaluator_queue=where,
        evaluator_token=token,
    )
    if not taken:
        return False
    if where == "control":
        logger.warning(
            "run %s: no cluster of the run is live; versions are evaluated on the control queue", run.pk
        )
    run_id = run.pk
    transaction.on_commit(lambda: dispatch.versions_evaluate_enqueue(run_id=run_id, token=token, queue=queue))
    return True


def versions_evaluate(
    *, run_id: int, token: str | None = None, limit: int | None = None, seconds: float | None = None
) -> int:
    """Evaluate the run's waiting versions, oldest first, at most `limit`, and none started
    after `seconds` (at least one); returns how many.

    The `training.versions_evaluate` task passes its `token` and EVAL_TASK_SECONDS: it goes on
    only while its token holds the run (a lapsed hold sent another, which now holds it), then
    releases the hold and sends the next evaluator, so a learner's chunks queued on the same
    cluster run between two tasks, while a small model's versions keep up with publishing. Without a token (an operator,
    a test) it evaluates as asked and leaves the hold alone. Idempotent: a version another
    evaluator filled meanwhile is not written again. A version is tried MAX_EVAL_ATTEMPTS
    times (a crash or a kill counts), then noted; one the store no longer holds is noted at
    once; when more wait than EVAL_BACKLOG, the oldest surplus is noted as skipped, so the
    versions retention pins for evaluation stay bounded."""
    run = TrainingRun.objects.filter(pk=run_id).first()
    if run is None or (token is not None and not _renew(run, token)):
        return 0
    done = 0
    try:
        _skip_backlog(run)
        engine = transport = None
        began = time.monotonic()
        while (limit is None or done < limit) and (
            seconds is None or done == 0 or time.monotonic() - began < seconds
        ):
            waiting = pending_evaluation(run)
            if not waiting:
                break
            record = waiting[0]
            if record.eval_attempts >= MAX_EVAL_ATTEMPTS:
                _note(record, f"evaluation failed {record.eval_attempts} times (see the worker's log)")
                continue
            GlobalVersionRecord.objects.filter(pk=record.pk).update(eval_attempts=F("eval_attempts") + 1)
            if engine is None or transport is None:
                engine, transport = run_engine(run), run_transport(run)
            versions = evaluation_versions(run, record, len(engine.fragments))
            started = time.perf_counter()
            try:
                loss = engine.evaluate(version_params(transport, engine.fragments, versions))
            except ObjectNotFoundError as exc:
                _note(record, f"versions {versions} are no longer in the store ({exc})")
                continue
            GlobalVersionRecord.objects.filter(pk=record.pk, eval_loss__isnull=True).update(eval_loss=loss)
            done += 1
            logger.info(
                "run %s: f%s v%s eval loss %.4f (%.2f s)",
                run.pk,
                record.fragment,
                record.version,
                loss,
                time.perf_counter() - started,
            )
    finally:
        # Any failure included: the attempt is counted, the hold released, the next one sent.
        if token is not None:
            TrainingRun.objects.filter(pk=run.pk, evaluator_token=token).update(
                evaluator_until=None, evaluator_token=""
            )
            versions_evaluate_send(run)
    return done


def _renew(run: TrainingRun, token: str) -> bool:
    """Renew the hold if `token` still holds the run (False: superseded, do nothing)."""
    hold = timezone.now() + timedelta(seconds=EVALUATOR_HOLD_SECONDS)
    return bool(TrainingRun.objects.filter(pk=run.pk, evaluator_token=token).update(evaluator_until=hold))


def _skip_backlog(run: TrainingRun) -> None:
    waiting = pending_evaluation(run)
    backlog = max(EVAL_BACKLOG, 2 * RunConfig(run.config).keep_versions)
    for record in waiting[: max(0, len(waiting) - backlog)]:
        _note(record, f"skipped: more than {backlog} versions waited for evaluation")


def _note(record: GlobalVersionRecord, note: str) -> None:
    logger.warning("run %s: f%s v%s not evaluated: %s", record.run_id, record.fragment, record.version, note)
    GlobalVersionRecord.objects.filter(pk=record.pk, eval_loss__isnull=True).update(eval_note=note[:200])
