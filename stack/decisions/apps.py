from __future__ import annotations

from django.apps import AppConfig


class DecisionsConfig(AppConfig):
    """Cost-quality decisions: build or buy for trained models, counterfactual routing replays,
    and recommendations with their evidence. A composition app: it reads training, inference and
    billing, and nothing below imports it."""

    name = "stack.decisions"
    label = "decisions"
    verbose_name = "Cost-quality decisions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Build or buy: training announces each registered model version and validates the
        # run option's registry part; the eval-set check and the scoring live here.
        from stack.decisions import buildbuy, buildbuy_tasks, recommendation_tasks  # noqa: F401 (registers the tasks)
        from stack.decisions.buildbuy_checks import build_or_buy_eval_sets_check
        from training.run_config.build_or_buy import run_config_check_register
        from training.signals import model_version_registered

        model_version_registered.connect(
            buildbuy.on_model_version_registered, dispatch_uid="decisions.build_or_buy"
        )
        run_config_check_register(build_or_buy_eval_sets_check)
