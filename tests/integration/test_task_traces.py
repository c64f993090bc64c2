"""A task sent while a span is current is traced by the real worker that runs it: its span joins
the sender's trace through the message headers and reaches the OTLP receiver from the worker."""

from __future__ import annotations

from typing import Any

import pytest

from registry.queues import CONTROL_QUEUE
from registry.tracing import tracer, tracing_configure, tracing_flush, tracing_shutdown
from tests.inference.test_tracing_otlp import OtlpReceiver, _attributes
from tests.integration.processes import Processes, wait_until
from training.tasks import syncer_tick_task

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_a_task_sent_inside_a_span_is_traced_by_the_worker_in_the_same_trace(
    processes: Processes, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = OtlpReceiver()
    try:
        worker_env = {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url,
            "OTEL_SERVICE_NAME": "switchyard-control",
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: the worker exports soon after the task
        }
        processes.start("control", "worker", "--control", "--loglevel", "warning", env=worker_env)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "switchyard-web")
        tracing_shutdown()
        assert tracing_configure()
        spans = tracer()
        assert spans is not None
        with spans.start_as_current_span("publisher") as publisher:
            syncer_tick_task.apply_async(args=(424242, "stale-token"), queue=CONTROL_QUEUE)
        assert tracing_flush()

        def task_span() -> Any:
            found = [
                (resource, span)
                for resource, span in receiver.spans
                if span.name == "training.syncer_tick"
                and _attributes(span).get("switchyard.training_run_id") == 424242
            ]
            return found[0] if found else None

        resource, task = wait_until(
            task_span, timeout=120, what="the worker's span\n" + processes.log("control")
        )
        sent = publisher.get_span_context()
        assert resource["service.name"] == "switchyard-control"
        assert task.trace_id == sent.trace_id.to_bytes(16, "big")
        assert task.parent_span_id == sent.span_id.to_bytes(8, "big")
    finally:
        tracing_shutdown()
        receiver.stop()
