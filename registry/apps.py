from __future__ import annotations

from django.apps import AppConfig


class RegistryConfig(AppConfig):
    """Providers, clusters, models, deployments, workflows, tokens, roles, health, failovers.

    The app lived at `stack.registry`; its label stays "stack" (its first home) so that existing
    databases migrate with nothing to do: its tables (`stack_*`), migrations, django_migrations
    rows, content types and permissions all keep their names."""

    name = "registry"
    label = "stack"
    verbose_name = "Registry"

    def ready(self) -> None:
        # Connect the worker-side heartbeat signal handlers, and register the bearer tokens'
        # OpenAPI security scheme (a drf-spectacular extension registers when it is defined).
        from registry import worker_signals  # noqa: F401
        from registry.api import schema  # noqa: F401
        from registry.auth import signals

        # Revocations, role changes and deactivations move the authorisation version.
        signals.connect()

        # Every S3 request (the object store, datasets, artifacts, exports) passes the outbound
        # guard. The endpoint is an admin's setting (OBJECT_STORE_ENDPOINT_URL), so it may be on
        # a private network (MinIO), never on a link-local or metadata address.
        from registry.outbound.guard import PRIVATE_ALLOWED, botocore_guard
        from storage.objectstore import set_request_guard

        set_request_guard(botocore_guard(PRIVATE_ALLOWED))
