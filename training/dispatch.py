"""Sending training's Celery tasks: their names, their queues and the one way to enqueue them.

training.services calls these (inside `transaction.on_commit` where the work depends on rows
it just wrote); training.tasks registers its tasks under the names defined here. This module
imports neither, so the arrows stay one way: tasks → services → dispatch.
"""

from __future__ import annotations

from registry.queues import CONTROL_QUEUE, cluster_queue, task_send

PROBE_JOB_RUN = "training.probe_job_run"
RUN_PLACE = "training.run_place"
LEARNER_CHUNK = "training.learner_chunk"
SYNCER_TICK = "training.syncer_tick"
VERSIONS_EVALUATE = "training.versions_evaluate"
RUNS_SUPERVISE = "training.runs_supervise"  # sent by beat (stack.settings.CELERY_BEAT_SCHEDULE)


def probe_job_run_enqueue(*, job_id: int, cluster_slug: str) -> None:
    """Run a probe job on its cluster's queue."""
    task_send(PROBE_JOB_RUN, job_id, queue=cluster_queue(cluster_slug))


def training_run_place_enqueue(*, run_id: int) -> None:
    """Place a run (the control queue)."""
    task_send(RUN_PLACE, run_id, queue=CONTROL_QUEUE)


def learner_chunk_enqueue(*, learner_id: int, generation: int, seq: int, cluster_slug: str) -> None:
    """Train chunk `seq` of a learner's generation on its cluster's queue."""
    task_send(LEARNER_CHUNK, learner_id, generation, seq, queue=cluster_queue(cluster_slug))


def syncer_tick_enqueue(*, run_id: int, token: str, countdown: float | None = None) -> None:
    """One tick of a run's syncer chain `token` (the control queue), now or after `countdown` s."""
    task_send(SYNCER_TICK, run_id, token, queue=CONTROL_QUEUE, countdown=countdown)


def versions_evaluate_enqueue(*, run_id: int, token: str, queue: str) -> None:
    """Evaluate a run's next recorded version on `queue` (a cluster's, or the control queue when
    no cluster of the run is live), as the evaluator holding `token` (training.services.evaluation)."""
    task_send(VERSIONS_EVALUATE, run_id, token, queue=queue)
