"""Sending training's Celery tasks: their names, their queues and the one way to enqueue them.

training.services calls these (inside `transaction.on_commit` where the work depends on rows
it just wrote); training.tasks registers its tasks under the names defined here. This module
imports neither, so the arrows stay one way: tasks → services → dispatch.
"""

from __future__ import annotations

from typing import Any

from celery import signature

from stack.registry.queues import CONTROL_QUEUE, cluster_queue

PROBE_JOB_RUN = "training.probe_job_run"
RUN_PLACE = "training.run_place"
LEARNER_CHUNK = "training.learner_chunk"
SYNCER_TICK = "training.syncer_tick"
RUNS_SUPERVISE = "training.runs_supervise"  # sent by beat (stack.settings.CELERY_BEAT_SCHEDULE)


def _send(name: str, args: tuple[Any, ...], *, queue: str, countdown: float | None = None) -> None:
    # A signature by name runs the registered task's own apply_async (so task_always_eager and
    # the task's options apply, as with `task.apply_async`); training.apps registers the tasks
    # in every process. An unregistered name would still be sent to the broker as is.
    options: dict[str, Any] = {"queue": queue}
    if countdown is not None:
        options["countdown"] = countdown
    signature(name, args=args, **options).apply_async()


def probe_job_run_enqueue(*, job_id: int, cluster_slug: str) -> None:
    """Run a probe job on its cluster's queue."""
    _send(PROBE_JOB_RUN, (job_id,), queue=cluster_queue(cluster_slug))


def training_run_place_enqueue(*, run_id: int) -> None:
    """Place a run (the control queue)."""
    _send(RUN_PLACE, (run_id,), queue=CONTROL_QUEUE)


def learner_chunk_enqueue(*, learner_id: int, generation: int, seq: int, cluster_slug: str) -> None:
    """Train chunk `seq` of a learner's generation on its cluster's queue."""
    _send(LEARNER_CHUNK, (learner_id, generation, seq), queue=cluster_queue(cluster_slug))


def syncer_tick_enqueue(*, run_id: int, token: str, countdown: float | None = None) -> None:
    """One tick of a run's syncer chain `token` (the control queue), now or after `countdown` s."""
    _send(SYNCER_TICK, (run_id, token), queue=CONTROL_QUEUE, countdown=countdown)
