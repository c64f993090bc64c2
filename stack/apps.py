from __future__ import annotations

from django.apps import AppConfig


class StackConfig(AppConfig):
    name = "stack"
    verbose_name = "Registry"

    def ready(self) -> None:
        # Connect the worker-side heartbeat signal handlers.
        from stack import worker_signals  # noqa: F401
