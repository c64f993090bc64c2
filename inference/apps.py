from __future__ import annotations

from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"

    def ready(self) -> None:
        # Django's pattern: signals import models, which cannot be imported before the app
        # registry is ready.
        from inference import signals

        signals.connect()
