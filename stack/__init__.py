"""Switchyard's Django project: settings, URLs, WSGI, the Celery app and the pages and commands that
span apps (the only package that may import every app)."""

from __future__ import annotations

# Load the Celery app with Django so that `@shared_task` binds to it.
from stack.celery import app as celery_app

__all__ = ["celery_app"]
