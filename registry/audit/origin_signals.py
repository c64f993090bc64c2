"""Celery tasks carry the origin "task:<name>" while they run (worker or eager)."""

from __future__ import annotations

from contextvars import Token
from typing import Any

from celery import signals

from registry.audit import origin as context

# task id -> the token to reset; a worker runs one task per thread at a time, an eager task
# runs inside its caller, and both reset in the same context they set.
_tokens: dict[str, Token[context.Origin | None]] = {}


def _task_started(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    if task_id is None or task is None:
        return
    _tokens[task_id] = context.enter(context.Origin(surface=context.Surface.TASK, label=f"task:{task.name}"))


def _task_finished(task_id: str | None = None, **_: Any) -> None:
    token = _tokens.pop(task_id or "", None)
    if token is not None:
        try:
            context.leave(token)
        except ValueError:  # set in another context (a pool that moved threads): drop it
            pass


def connect() -> None:
    signals.task_prerun.connect(_task_started, dispatch_uid="audit-origin-start", weak=False)
    signals.task_postrun.connect(_task_finished, dispatch_uid="audit-origin-end", weak=False)
