"""Version evaluation, off the control queue: the syncer records each global version at once
(training.services.syncer) and an evaluator on a cluster's queue fills in its eval loss.

Where: the run's `placement.eval_cluster` when it is live; else the live cluster of the run's
learners with the most accelerators, a GPU cluster before a CPU one; else (no cluster of the
run is live) the control queue, so that versions are still evaluated, with a warning. One
evaluator per run at a time: sending one takes the run's hold (TrainingRun.evaluator_until) and
the evaluator renews it per version; a hold that lapses (a lost task, a dead worker) lets the
next syncer tick send another, to wherever is live then.

What: each version's eval loss is that of the global parameters right after it, the version's
own fragment with every other fragment at its newest version published no later (the same
parameters the syncer held when it recorded the version), on the run's eval windows
(`eval_windows`, sampled once per run: the token budget is windows × block size). The versions
a pending evaluation reads are pinned in the store until it is done (training.services.
retention). A version the store no longer holds is noted on its record and left unevaluated.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from registry.models import Cluster
from registry.queues import CONTROL_QUEUE, cluster_queue
from storage.objectstore import ObjectNotFoundError
from training import dispatch
from training.models import GlobalVersionRecord, TrainingLearner, TrainingRun
from training.run_config import RunConfig
from training.run_engines import run_engine, run_transport, version_params

logger = logging.getLogger(__name__)

# How long a sent evaluator holds the run before it starts, and then per version it evaluates.
EVALUATOR_HOLD_SECONDS = 600.0
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
    tick asks after recording; sending takes the hold, so ticks send one evaluator, not many).
    Sent after the caller's transaction commits; True when one was sent."""
    if not GlobalVersionRecord.objects.filter(run=run, eval_loss__isnull=True, eval_note="").exists():
        return False
    now = timezone.now()
    queue, where = evaluator_queue(run)
    taken = TrainingRun.objects.filter(
        Q(evaluator_until__isnull=True) | Q(evaluator_until__lt=now), pk=run.pk
    ).update(evaluator_until=now + timedelta(seconds=EVALUATOR_HOLD_SECONDS), evaluator_queue=where)
    if not taken:
        return False
    if where == "control":
        logger.warning(
            "run %s: no cluster of the run is live; versions are evaluated on the control queue", run.pk
        )
    run_id = run.pk
    transaction.on_commit(lambda: dispatch.versions_evaluate_enqueue(run_id=run_id, queue=queue))
    return True


def versions_evaluate(*, run_id: int) -> int:
    """The evaluator (the `training.versions_evaluate` task): fill in the eval loss of every
    version waiting for one, oldest first, renewing the run's hold per version; then release
    it. Idempotent: a version another evaluator filled meanwhile is not written again. Returns
    how many it evaluated."""
    run = TrainingRun.objects.filter(pk=run_id).first()
    if run is None:
        return 0
    engine = run_engine(run)
    transport = run_transport(run)
    fragments = len(engine.fragments)
    done = 0
    try:
        while True:
            waiting = pending_evaluation(run)
            if not waiting:
                break
            record = waiting[0]
            hold = timezone.now() + timedelta(seconds=EVALUATOR_HOLD_SECONDS)
            TrainingRun.objects.filter(pk=run.pk).update(evaluator_until=hold)
            versions = evaluation_versions(run, record, fragments)
            started = time.perf_counter()
            try:
                loss = engine.evaluate(version_params(transport, engine.fragments, versions))
            except ObjectNotFoundError as exc:
                _note(record, f"versions {versions} are no longer in the store ({exc})")
                continue
            except Exception as exc:  # noqa: BLE001 (noted on the version, not retried by every tick)
                logger.exception("run %s: f%s v%s evaluation failed", run.pk, record.fragment, record.version)
                _note(record, f"evaluation failed: {type(exc).__name__}: {exc}")
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
        TrainingRun.objects.filter(pk=run.pk).update(evaluator_until=None)
    # A version recorded after the last look, by a tick that found the run held: send again.
    versions_evaluate_send(run)
    return done


def _note(record: GlobalVersionRecord, note: str) -> None:
    logger.warning("run %s: f%s v%s not evaluated: %s", record.run_id, record.fragment, record.version, note)
    GlobalVersionRecord.objects.filter(pk=record.pk, eval_loss__isnull=True).update(eval_note=note[:200])
