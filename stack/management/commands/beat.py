"""Start Celery beat with the database scheduler (django-celery-beat)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from stack.celery import app


class Command(BaseCommand):
    help = "Run Celery beat: periodic cluster health checks and other scheduled work."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--loglevel", default="info")

    def handle(self, *args: Any, **options: Any) -> None:
        app.start(
            argv=[
                "beat",
                "--scheduler",
                settings.CELERY_BEAT_SCHEDULER,
                "--loglevel",
                options["loglevel"],
                "--pidfile=",
            ]
        )
