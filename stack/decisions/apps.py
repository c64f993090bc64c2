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
