from __future__ import annotations

from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"

    def ready(self) -> None:
        from inference import signals

        signals.connect()
