"""Worker-side heartbeats.

`python manage.py worker --cluster SLUG` sets SWITCHYARD_WORKER_CLUSTER; once
the Celery worker is ready, a daemon thread in its main process records a
heartbeat every HEARTBEAT_SECONDS. The thread is independent of task
execution, so a worker busy with a long training chunk still reports alive,
while a killed or hung-up process falls silent and beat marks its cluster down.

A spot interruption notice can also reach a cluster's worker as a signal (INTERRUPTION_SIGNAL,
sent by whatever on the node learns of the reclaim, e.g. from the cloud's instance metadata): the
handler only raises a flag, and the heartbeat thread files the notice for its cluster
(cluster_interruption_notice, as the API does), so the chunks of every worker of the cluster
push their deltas and stop, and training moves their learners.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Mapping
from typing import Any

from celery.signals import worker_ready, worker_shutdown
from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from registry.models import Cluster
from registry.services import RegistryError, cluster_heartbeat, cluster_interruption_notice

logger = logging.getLogger(__name__)

WORKER_CLUSTER_ENV = "SWITCHYARD_WORKER_CLUSTER"
# SIGUSR2, not SIGUSR1 (Celery's worker dumps its threads' tracebacks on SIGUSR1) nor SIGTERM
# (Celery's warm shutdown, which would let the running chunk go on for its full length).
INTERRUPTION_SIGNAL = signal.SIGUSR2
_stop = threading.Event()
_wake = threading.Event()  # ends the heartbeat thread's wait early: a stop or a notice
_interrupted = threading.Event()


def _on_interruption_signal(signum: int, frame: Any) -> None:
    # A handler runs between two bytecodes of the main thread, maybe inside a database call
    # there: it only sets flags, and the heartbeat thread (its own connection) does the write.
    _interrupted.set()
    _wake.set()


def _file_interruption(cluster_slug: str) -> None:
    cluster = Cluster.objects.filter(slug=cluster_slug).first()
    if cluster is None:
        return
    try:
        cluster_interruption_notice(cluster=cluster)
    except RegistryError as exc:  # not spot capacity: say so, and keep the worker going
        logger.error("interruption signal for cluster %s refused: %s", cluster_slug, exc)


WORKER_DEVICES_ENV = "SWITCHYARD_WORKER_DEVICES"


def worker_devices(environ: Mapping[str, str] | None = None, *, gpus: int | None = None) -> list[int]:
    """The accelerators this worker offers, as device ordinals its processes see: the
    SWITCHYARD_WORKER_DEVICES list ("0,1"; "" for none) when set, else one per entry of
    CUDA_VISIBLE_DEVICES when set, else one per GPU `nvidia-smi -L` lists (`gpus`: that count,
    for tests), else none. Read without initialising CUDA: the worker forks its pool after this."""
    env = os.environ if environ is None else environ
    named = env.get(WORKER_DEVICES_ENV)
    if named is not None:
        try:
            ordinals = [int(x) for x in named.replace(" ", "").split(",") if x]
        except ValueError:
            raise ValueError(
                f"{WORKER_DEVICES_ENV} must be device ordinals such as 0,1 (got {named!r})"
            ) from None
        if any(d < 0 for d in ordinals) or len(set(ordinals)) != len(ordinals):
            raise ValueError(f"{WORKER_DEVICES_ENV} must list distinct ordinals from 0 (got {named!r})")
        return ordinals
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return list(range(len([x for x in visible.split(",") if x.strip() and x.strip() != "-1"])))
    if gpus is None:
        gpus = _nvidia_smi_gpus()
    return list(range(gpus))


def _nvidia_smi_gpus() -> int:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False)  # noqa: S603
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))


def _beat_forever(cluster_slug: str, hostname: str) -> None:
    started_at = timezone.now()
    pid = os.getpid()
    devices = worker_devices()
    logger.info("cluster %s: worker %s offers devices %s", cluster_slug, hostname, devices or "none (CPU)")
    while not _stop.is_set():
        # Cleared before the flags are read, so a signal arriving after this is seen by the
        # check below or ends the wait at once.
        _wake.clear()
        try:
            close_old_connections()
            if _interrupted.is_set():
                _interrupted.clear()
                _file_interruption(cluster_slug)
            if (
                cluster_heartbeat(
                    cluster_slug=cluster_slug,
                    hostname=hostname,
                    pid=pid,
                    started_at=started_at,
                    devices=devices,
                )
                is None
            ):
                logger.error("heartbeat: cluster %r is not registered", cluster_slug)
        except Exception:
            # The database may be briefly unreachable; keep trying, the
            # cluster turns degraded/down meanwhile, which is the truth.
            logger.exception("heartbeat for cluster %s failed", cluster_slug)
        _wake.wait(settings.HEARTBEAT_SECONDS)
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
    try:
        signal.signal(INTERRUPTION_SIGNAL, _on_interruption_signal)
    except ValueError:  # not the main thread: the notice still comes through the API
        logger.warning("cluster %s: no handler for the interruption signal", cluster_slug)
    else:
        logger.info(
            "cluster %s: signal %s is a spot interruption notice", cluster_slug, INTERRUPTION_SIGNAL.name
        )


@worker_shutdown.connect
def _stop_heartbeats(**kwargs: Any) -> None:
    _stop.set()
    _wake.set()
