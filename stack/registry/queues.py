"""Celery queue names, defined in one place."""

from __future__ import annotations

CONTROL_QUEUE = "control"
CLUSTER_QUEUE_PREFIX = "cluster."


def cluster_queue(slug: str) -> str:
    """The queue that a cluster's workers consume: `cluster.<slug>`."""
    return f"{CLUSTER_QUEUE_PREFIX}{slug}"
