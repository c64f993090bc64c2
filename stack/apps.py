from __future__ import annotations

from django.apps import AppConfig


class SwitchyardConfig(AppConfig):
    """The project's composition (settings, urls, Celery app, overview, health, demo and the
    commands that span apps). It has no models; it is an app so that its management commands
    (demo, bench, worker, beat, …) are found."""

    name = "stack"
    label = "switchyard"
    verbose_name = "Switchyard"
