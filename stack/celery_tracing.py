"""Celery tasks as spans, when tracing is on (registry.tracing).

A task published while a span is current carries that span's context in its message headers
(W3C traceparent), so the task's span joins the publisher's trace: a gateway request that
queues work, a syncer tick scheduled by a learner's chunk. Every task runs inside a CONSUMER
span named after the task; the services tie it to what it works for with `span_attributes`
(switchyard.training_run_id on learner chunks and syncer ticks, switchyard.batch_job_id on batch
jobs, whose lines are child spans). Task arguments are not recorded (a syncer tick's carries
its claim token).

Connected when stack.celery is imported, in every process; each handler returns at once while
tracing is off.
"""

from __future__ import annotations

from typing import Any

from celery.signals import before_task_publish, task_postrun, task_prerun
from opentelemetry import context, propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import SpanKind, Status, StatusCode

from registry.tracing import tracer

# task id -> (span, the context token to detach); a worker runs one task per thread at a time.
_open: dict[str, tuple[trace.Span, object]] = {}


class _RequestGetter(Getter[Any]):
    """Reads propagated headers from a task's request (Celery puts custom headers there)."""

    def get(self, carrier: Any, key: str) -> list[str] | None:
        value = getattr(carrier, key, None)
        if value is None and isinstance(getattr(carrier, "headers", None), dict):
            value = carrier.headers.get(key)
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: Any) -> list[str]:
        return []


_getter = _RequestGetter()


@before_task_publish.connect
def _inject(headers: dict[str, Any] | None = None, **_: Any) -> None:
    if tracer() is None or headers is None:
        return
    propagate.inject(headers)


@task_prerun.connect
def _start(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    spans = tracer()
    if spans is None or task_id is None or task is None:
        return
    parent = propagate.extract(task.request, getter=_getter)
    span = spans.start_span(
        str(task.name),
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes={"messaging.system": "celery", "celery.task_id": task_id, "celery.task_name": task.name},
    )
    token = context.attach(trace.set_span_in_context(span))
    _open[task_id] = (span, token)


@task_postrun.connect
def _end(task_id: str | None = None, state: str | None = None, **_: Any) -> None:
    if task_id is None:
        return
    opened = _open.pop(task_id, None)
    if opened is None:
        return
    span, token = opened
    context.detach(token)  # type: ignore[arg-type]
    if state == "FAILURE":
        span.set_status(Status(StatusCode.ERROR, "task failed"))
    span.end()
