"""A spot interruption notice sent to a cluster's worker as a signal: the worker's heartbeat thread
files it for its cluster, as the API does (draining, with the default deadline)."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from registry import worker_signals
from registry.models import Cluster
from tests.factories import make_cluster


def _wait_for(predicate: Any, *, limit_s: float = 30.0) -> bool:
    """Poll until `predicate()` holds (a bound on waiting, not a speed check)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.mark.django_db(transaction=True)
def test_the_interruption_signal_makes_the_worker_file_a_notice_for_its_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = make_cluster(capacity_type=Cluster.CapacityType.SPOT)
    monkeypatch.setenv(worker_signals.WORKER_CLUSTER_ENV, cluster.slug)
    previous = signal.getsignal(worker_signals.INTERRUPTION_SIGNAL)
    try:
        worker_signals._start_heartbeats(sender=None)
        assert _wait_for(lambda: Cluster.objects.get(pk=cluster.pk).last_heartbeat_at is not None)
        assert Cluster.objects.get(pk=cluster.pk).status == "healthy"

        os.kill(os.getpid(), worker_signals.INTERRUPTION_SIGNAL)
        assert _wait_for(lambda: Cluster.objects.get(pk=cluster.pk).interrupted)
        cluster.refresh_from_db()
        assert cluster.status == "draining" and cluster.interruption_deadline is not None
    finally:
        worker_signals._stop_heartbeats()
        for thread in threading.enumerate():
            if thread.name == "switchyard-heartbeat":
                thread.join(timeout=30)
        signal.signal(worker_signals.INTERRUPTION_SIGNAL, previous)
