"""OpenTelemetry traces, received by a real OTLP/HTTP endpoint on loopback.

The receiver is an http.server the test starts: it accepts POST /v1/traces, decodes the protobuf
body with opentelemetry-proto (as a collector would) and keeps the spans. Tracing is configured
the way a process configures it, from the standard OTEL_* variables.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from opentelemetry import propagate, trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from bench.mockprovider import MockProviderServer
from registry.models import RoutingPolicyVersion
from registry.services import api_token_create
from registry.tracing import tracer, tracing_configure, tracing_flush, tracing_shutdown
from tests.inference.helpers import priced_deployment, routed_workflow
from training.tasks import syncer_tick_task

pytestmark = pytest.mark.django_db


class OtlpReceiver:
    """An OTLP/HTTP traces endpoint on loopback: every span it was sent, with its resource."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict[str, Any], Span]] = []
        self.posts = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest.FromString(body)
                for resource_spans in request.resource_spans:
                    resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                    for scope_spans in resource_spans.scope_spans:
                        receiver.spans += [(resource, span) for span in scope_spans.spans]
                receiver.posts += 1
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass  # quiet: the receiver's access log would only clutter the test output

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(span: Span) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in span.attributes}


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """Tracing on, exporting to a receiver on loopback (as OTEL_* variables would set it up)."""
    server = OtlpReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", server.url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "switchyard-test")
    tracing_shutdown()
    assert tracing_configure()
    yield server
    tracing_shutdown()
    server.stop()


def test_a_failover_request_is_one_trace_with_a_span_per_attempt(
    receiver: OtlpReceiver, admin_user: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    failing, healthy = mock_provider(status=503), mock_provider(tokens_in=21, tokens_out=9)
    primary, fallback = priced_deployment(failing), priced_deployment(healthy)
    workflow = routed_workflow(admin_user, [primary, fallback])
    _, raw = api_token_create(user=admin_user, name="traces")
    body = {"model": workflow.slug, "messages": [{"role": "user", "content": "ping"}]}
    answer = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
        "/v1/chat/completions", json.dumps(body), content_type="application/json"
    )
    assert answer.status_code == 200 and answer["x-switchyard-deployment"] == fallback.slug
    assert tracing_flush()

    assert receiver.posts >= 1
    spans = [span for _, span in receiver.spans]
    assert {resource["service.name"] for resource, _ in receiver.spans} == {"switchyard-test"}
    assert len({span.trace_id for span in spans}) == 1  # one trace
    (request,) = [s for s in spans if not s.parent_span_id]
    calls = sorted((s for s in spans if s.parent_span_id), key=lambda s: s.start_time_unix_nano)
    assert len(calls) == 2 and all(c.parent_span_id == request.span_id for c in calls)

    version = RoutingPolicyVersion.objects.filter(workflow=workflow).order_by("-version").first()
    assert version is not None
    top = _attributes(request)
    assert request.name == f"chat {workflow.slug}"
    assert top["gen_ai.operation.name"] == "chat"
    assert top["gen_ai.system"] == "openai"
    assert top["gen_ai.request.model"] == workflow.slug
    assert top["gen_ai.response.model"]
    assert (top["gen_ai.usage.input_tokens"], top["gen_ai.usage.output_tokens"]) == (21, 9)
    assert top["gen_ai.response.finish_reasons"] == ["stop"]
    assert top["switchyard.policy_version"] == version.version
    assert top["switchyard.cost"] == answer["x-switchyard-cost"]
    assert top["switchyard.deployment"] == fallback.slug

    failed, answered = (_attributes(c) for c in calls)
    assert failed["switchyard.deployment"] == primary.slug and failed["http.response.status_code"] == 503
    assert failed["error.type"] == "503" and calls[0].status.code == Status.STATUS_CODE_ERROR
    assert calls[0].name == f"chat {failed['gen_ai.request.model']}" and failed["gen_ai.request.model"]
    assert answered["switchyard.deployment"] == fallback.slug and answered["switchyard.outcome"] == "ok"
    assert (answered["gen_ai.usage.input_tokens"], answered["gen_ai.usage.output_tokens"]) == (21, 9)
    assert answered["gen_ai.response.finish_reasons"] == ["stop"]
    assert calls[1].kind == Span.SPAN_KIND_CLIENT
    # The call spans lie inside the request span, in the order they were made.
    assert request.start_time_unix_nano <= calls[0].start_time_unix_nano <= calls[0].end_time_unix_nano
    assert calls[0].end_time_unix_nano <= calls[1].start_time_unix_nano
    assert calls[1].end_time_unix_nano <= request.end_time_unix_nano


def test_a_celery_task_is_a_span_named_after_it_that_carries_its_run_id(receiver: OtlpReceiver) -> None:
    syncer_tick_task.apply(args=(424242, "stale-token"))  # no such run: the claim is a no-op
    assert tracing_flush()
    (span,) = [s for _, s in receiver.spans]
    assert span.name == "training.syncer_tick" and span.kind == Span.SPAN_KIND_CONSUMER
    attributes = _attributes(span)
    assert attributes["switchyard.training_run_id"] == 424242
    assert attributes["messaging.system"] == "celery"
    assert "stale-token" not in str(attributes)  # task arguments are not recorded


def test_without_an_otlp_endpoint_tracing_stays_off(
    monkeypatch: pytest.MonkeyPatch, admin_user: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    tracing_shutdown()
    assert not tracing_configure()
    assert tracer() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not tracing_configure() and tracer() is None


def test_a_task_sent_inside_a_span_joins_that_spans_trace(receiver: OtlpReceiver) -> None:
    spans = tracer()
    assert spans is not None
    publisher = spans.start_span("publisher")
    headers: dict[str, str] = {}
    # What before_task_publish adds to a message's headers while `publisher` is current.
    propagate.inject(headers, context=trace.set_span_in_context(publisher))
    syncer_tick_task.apply(args=(7, "stale-token"), headers=headers)
    publisher.end()
    assert tracing_flush()
    by_name = {s.name: s for _, s in receiver.spans}
    task, parent = by_name["training.syncer_tick"], by_name["publisher"]
    assert task.trace_id == parent.trace_id and task.parent_span_id == parent.span_id


def test_an_otlp_protocol_other_than_http_protobuf_stops_the_process_naming_it() -> None:
    from django.core.exceptions import ImproperlyConfigured

    from registry.tracing import tracing_wanted

    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    with pytest.raises(ImproperlyConfigured, match="OTEL_EXPORTER_OTLP_PROTOCOL"):
        tracing_wanted(environ)
    assert not tracing_wanted({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})  # no endpoint: off, whatever else
    assert not tracing_wanted({**environ, "OTEL_TRACES_EXPORTER": "none"})
