from __future__ import annotations

from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "inference"

    def ready(self) -> None:
        # Django's pattern: signals import models, which cannot be imported before the app
        # registry is ready.
        # The registry judges who may name an object-store key; it learns here who owns a batch
        # job's folder (inference/batch/jobs/<id>-<stamp>/: the job's workflow's team).
        from billing.quality import quality_source_register

        # The tasks register in every process, so that sends by name (registry.queues.task_send) find them.
        from inference import signals, tasks  # noqa: F401
        from inference.batch.lines import batch_key_team
        from inference.stats_selectors import deployment_quality_means
        from registry.store.keys import object_owner_register

        signals.connect()
        object_owner_register("inference", batch_key_team)
        # The billing dashboard's cost per quality point reads the scores through billing.quality.
        quality_source_register(deployment_quality_means)
