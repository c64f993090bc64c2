from __future__ import annotations

from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"

    def ready(self) -> None:
        # Django's pattern: signals import models, which cannot be imported before the app
        # registry is ready.
        # The registry judges who may name an object-store key; it learns here who owns a batch
        # job's folder (inference/batch/<id>-<stamp>/: the job's workflow's team).
        from inference import signals
        from inference.batch import batch_key_team
        from stack.registry.object_keys import object_owner_register

        signals.connect()
        object_owner_register("inference", batch_key_team)
