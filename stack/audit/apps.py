from __future__ import annotations

from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "stack.audit"
    label = "audit"
    verbose_name = "Audit trail"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from stack.audit import origin_signals, registration

        registration.register_tracked_models()
        origin_signals.connect()
