from __future__ import annotations

from django.apps import AppConfig


class RegistryConfig(AppConfig):
    """Providers, clusters, models, deployments, workflows, tokens, roles, health, failovers.

    The label stays "stack" (the app's first home), so its tables, migrations and content
    types are unchanged."""

    name = "stack.registry"
    label = "stack"
    verbose_name = "Registry"

    def ready(self) -> None:
        # Connect the worker-side heartbeat signal handlers, and register the bearer tokens'
        # OpenAPI security scheme (a drf-spectacular extension registers when it is defined).
        from stack.registry import schema, worker_signals  # noqa: F401
