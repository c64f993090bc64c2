"""Worker-side heartbeats.

`python manage.py worker --cluster SLUG` sets SWITCHYARD_WORKER_CLUSTER; once
the Celery worker is ready, a daemon thread in its main process records a
heartbeat every HEARTBEAT_SECONDS. The thread is independent of task
execution, so a worker busy with a long training chunk still reports alive,
while a killed or hung-up process falls silent and beat marks its cluster down.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from celery.signals import worker_ready, worker_shutdown
from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from stack.registry.services import cluster_heartbeat

logger = logging.getLogger(__name__)

WORKER_CLUSTER_ENV = "SWITCHYARD_WORKER_CLUSTER"
_stop = threading.Event()


def _beat_forever(cluster_slug: str, hostname: str) -> None:
    started_at = timezone.now()
    pid = os.getpid()
    while not _stop.is_set():
        try:
            close_old_connections()
            if (
                cluster_heartbeat(
                    cluster_slug=cluster_slug, hostname=hostname, pid=pid, started_at=started_at
                )
                is None
            ):
                logger.error("heartbeat: cluster %r is not registered", cluster_slug)
        except Exception:
            # The database may be briefly unreachable; keep trying, the
            # cluster turns degraded/down meanwhile, which is the truth.
            logger.exception("heartbeat for cluster %s failed", cluster_slug)
        _stop.wait(settings.HEARTBEAT_SECONDS)
    connection.close()


@worker_ready.connect
def _start_heartbeats(sender: Any = None, **kwargs: Any) -> None:
    cluster_slug = os.environ.get(WORKER_CLUSTER_ENV)
    if not cluster_slug:
        return
    hostname = getattr(sender, "hostname", None) or f"{cluster_slug}@{socket.gethostname()}"
    _stop.clear()
    thread = threading.Thread(
        target=_beat_forever, args=(cluster_slug, hostname), name="switchyard-heartbeat", daemon=True
    )
    thread.start()
    logger.info("heartbeats for cluster %s every %.1fs", cluster_slug, settings.HEARTBEAT_SECONDS)


@worker_shutdown.connect
def _stop_heartbeats(**kwargs: Any) -> None:
    _stop.set()
