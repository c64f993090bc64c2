from __future__ import annotations

from django.apps import AppConfig


class TrainingConfig(AppConfig):
    name = "training"

    def ready(self) -> None:
        # Register the tasks (and their worker signal handlers) in every process, so that
        # training.dispatch's sends by name find them: with task_always_eager they then run in
        # place, as `task.apply_async` does. Imported here, not at the top: the module imports
        # models, which cannot load before the app registry is ready. It does not import torch.
        from training import tasks  # noqa: F401
