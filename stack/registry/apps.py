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
        from stack.registry import schema, signals, worker_signals  # noqa: F401

        # Revocations, role changes and deactivations move the authorisation version.
        signals.connect()

        # Every S3 request (the object store, datasets, artifacts, exports) passes the outbound
        # guard. The endpoint is an admin's setting (OBJECT_STORE_ENDPOINT_URL), so it may be on
        # a private network (MinIO), never on a link-local or metadata address.
        from stack.registry.outbound import PRIVATE_ALLOWED, botocore_guard
        from storage.objectstore import set_request_guard

        set_request_guard(botocore_guard(PRIVATE_ALLOWED))
