"""OpenTelemetry traces: on only when the standard OTEL_* variables name an OTLP endpoint.

Every app asks `tracer()` for the process's tracer; it is None while tracing is off, so an
instrumented path costs one global read and an `if`, not even a no-op span. `tracing_configure`
(called once per process by stack.apps at start-up) turns it on when
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT is set: the official SDK's
TracerProvider, a BatchSpanProcessor (spans leave on a background thread, never on the request
path) and the OTLP/HTTP protobuf exporter, which reads the endpoint, headers, timeout and TLS
settings from the same variables. OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none keep it
off; OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES name the process as the SDK documents.

The provider is kept here rather than installed as OpenTelemetry's global one: a global can be
set once per process, and tests configure tracing against a receiver they start per test. The
context (the current span) is OpenTelemetry's own, so spans nest across modules as usual.

This module sits in the registry, the lowest app layer, because training, inference and the
composition all instrument their work with it; it imports no app.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from opentelemetry import trace

_tracer: trace.Tracer | None = None
_provider: Any = None  # opentelemetry.sdk.trace.TracerProvider, imported only when tracing is on
_lock = threading.Lock()

TRACER_NAME = "switchyard"
DEFAULT_SERVICE_NAME = "switchyard"


def tracing_wanted(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces over OTLP (the OpenTelemetry spec's variables)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")}
    if "otlp" not in exporters:
        return False
    if not (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    ):
        return False
    protocol = environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    )
    if protocol.strip() != "http/protobuf":
        raise ImproperlyConfigured(
            f"OTEL_EXPORTER_OTLP_PROTOCOL: only http/protobuf is supported, got {protocol!r}"
        )
    return True


def tracing_configure(*, environ: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on when the environment asks for it; returns whether it is on.

    The exporter reads os.environ itself (endpoint, headers, timeout, certificates), so
    `environ` only decides whether tracing is wanted.
    """
    global _tracer, _provider
    if not tracing_wanted(os.environ if environ is None else environ):
        return False
    # Imported here: a process that exports nothing never loads the SDK or the exporter.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    with _lock:
        if _provider is not None:
            return True
        attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: DEFAULT_SERVICE_NAME}
        provider = TracerProvider(resource=Resource.create(attributes))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        _provider = provider
        _tracer = provider.get_tracer(TRACER_NAME)
    return True


def tracing_shutdown() -> None:
    """Export what is buffered and turn tracing off (process exit; tests)."""
    global _tracer, _provider
    with _lock:
        provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


def tracing_flush(timeout_ms: int = 30_000) -> bool:
    """Export the buffered spans now (a task that ends a worker's life; tests)."""
    provider = _provider
    return bool(provider.force_flush(timeout_ms)) if provider is not None else True


def tracer() -> trace.Tracer | None:
    """The process's tracer, or None while tracing is off."""
    return _tracer


def span_attributes(**attributes: str | int | float | bool) -> None:
    """Set `switchyard.<name>` attributes on the current span (a no-op while tracing is off or no
    span is current): ties a task's span to the run or job its work belongs to."""
    if _tracer is None:
        return
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes({f"switchyard.{name}": value for name, value in attributes.items()})
