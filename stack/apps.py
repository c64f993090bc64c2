from __future__ import annotations

from django.apps import AppConfig


class SwitchyardConfig(AppConfig):
    """The project's composition (settings, urls, Celery app, overview, health, demo and the
    commands that span apps). It has no models; it is an app so that its management commands
    (demo, bench, worker, beat, …) are found."""

    name = "stack"
    label = "switchyard"
    verbose_name = "Switchyard"

    def ready(self) -> None:
        from registry.tracing import tracing_configure

        # Traces over OTLP when the standard OTEL_* variables name an endpoint; off otherwise.
        # Each process configures itself (gunicorn loads the app in each worker after the fork).
        tracing_configure()
