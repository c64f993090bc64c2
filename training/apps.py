from __future__ import annotations

from django.apps import AppConfig


class TrainingConfig(AppConfig):
    name = "training"

    def ready(self) -> None:
        # Imported here, not at the top: these modules import models, which cannot load before the
        # app registry is ready (none imports torch).
        # The tasks register in every process, so that training.dispatch's sends by name find them:
        # with task_always_eager they then run in place, as `task.apply_async` does.
        # Billing's budgets name runs by id but may not import training: they ask the registry,
        # which learns here how to tell whether a run exists and which team owns it.
        # The same for the object store's `runs/<id>/` keys: the registry judges who may name them.
        from registry.auth.subjects import subject_kind_register
        from registry.store.keys import object_owner_register
        from training import tasks  # noqa: F401
        from training.selectors import training_run_exists, training_run_key_team, training_runs_of_teams

        subject_kind_register("training_run", exists=training_run_exists, in_teams=training_runs_of_teams)
        object_owner_register("runs", training_run_key_team)
