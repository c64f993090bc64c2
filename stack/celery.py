"""The Celery application shared by web, workers and beat."""

from __future__ import annotations

import os

from celery import Celery

from stack import embedded_broker, redis_broker

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stack.settings")
# `filesystem://` (the embedded default broker) writes messages atomically.
embedded_broker.install()
# `redis://` survives Redis going away under a worker that holds unacked messages.
redis_broker.install()

app = Celery("switchyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Celery tasks as spans when OTEL_* turns tracing on (a no-op otherwise).
from stack import celery_tracing  # noqa: E402,F401
