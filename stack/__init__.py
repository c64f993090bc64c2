"""Switchyard's Django project and the registry app."""

from __future__ import annotations

# Load the Celery app with Django so that `@shared_task` binds to it.
from stack.celery import app as celery_app

__all__ = ["celery_app"]
