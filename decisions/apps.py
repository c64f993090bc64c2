from __future__ import annotations

from django.apps import AppConfig


class DecisionsConfig(AppConfig):
    """Cost-quality decisions: build or buy for trained models, counterfactual routing replays,
    and recommendations with their evidence. A composition app: it reads training, inference and
    billing, and nothing below imports it.

    The app lived at `stack.decisions`; its explicit label "decisions" keeps its tables,
    migrations, django_migrations rows, content types and permissions as they were."""

    name = "decisions"
    label = "decisions"
    verbose_name = "Cost-quality decisions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Build or buy: training announces each registered model version and validates the
        # run option's registry part; the eval-set check and the scoring live here.
        from decisions.buildbuy import services as buildbuy
        from decisions.buildbuy import tasks as buildbuy_tasks  # noqa: F401 (registers the tasks)
        from decisions.buildbuy.checks import build_or_buy_eval_sets_check
        from decisions.recommendations import tasks as recommendation_tasks  # noqa: F401 (registers the tasks)

        # Each family keeps its tasks beside its work; Celery's autodiscovery looks only for
        # decisions.tasks, so each family's task module is imported here.
        from decisions.replay import tasks as replay_tasks  # noqa: F401 (registers the tasks)
        from training.run_config.build_or_buy import run_config_check_register
        from training.signals import model_version_registered

        model_version_registered.connect(
            buildbuy.on_model_version_registered, dispatch_uid="decisions.build_or_buy"
        )
        run_config_check_register(build_or_buy_eval_sets_check)
