"""Celery queues and the one way every app enqueues a task.

Every app sends its tasks by registered name (`task_send`), on a queue named here; the code
that enqueues never imports the task's module, so no app holds an import circle between its
services and its tasks (the task module imports the services, never the other way round).
Work that reads rows the caller has just written is sent after the commit: the caller wraps
the send in `transaction.on_commit` (a rolled-back write sends nothing).
"""

from __future__ import annotations

from typing import Any

from celery import signature

CONTROL_QUEUE = "control"
CLUSTER_QUEUE_PREFIX = "cluster."


def cluster_queue(slug: str) -> str:
    """The queue that a cluster's workers consume: `cluster.<slug>`."""
    return f"{CLUSTER_QUEUE_PREFIX}{slug}"


def task_send(name: str, *args: Any, queue: str, countdown: float | None = None) -> None:
    """Enqueue the task registered as `name` with `args` on `queue` (after `countdown` s).

    A signature by name runs the registered task's own apply_async, so CELERY_TASK_ALWAYS_EAGER
    and the task's options (retries, ignore_result) apply as with `task.apply_async`; every
    app's tasks are registered in every process (Celery's autodiscovery from stack.celery). An
    unregistered name would still be sent to the broker as is."""
    options: dict[str, Any] = {"queue": queue}
    if countdown is not None:
        options["countdown"] = countdown
    signature(name, args=args, **options).apply_async()
