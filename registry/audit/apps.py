from __future__ import annotations

from django.apps import AppConfig


class AuditConfig(AppConfig):
    """The audit trail. It imports only the registry, so it lives beside it; it lived at
    `stack.audit`, and its explicit label "audit" keeps its tables, migrations, django_migrations
    rows, content types and permissions as they were."""

    name = "registry.audit"
    label = "audit"
    verbose_name = "Audit trail"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from registry.audit import origin_signals, registration

        registration.register_tracked_models()
        origin_signals.connect()
