"""The failover taxonomy: one code per cause, shared by training, inference and cluster health.

Every FailoverEvent carries one of these codes (its `reason` keeps the human sentence). Pages,
the API and exports filter on them; metrics and alerts group by them. Adding a cause means
adding it here and nowhere else.
"""

from __future__ import annotations

from django.db import models


class FailoverCode(models.TextChoices):
    # Clusters and training learners.
    HEARTBEAT_TIMEOUT = "heartbeat_timeout", "Heartbeat timeout"
    PREEMPTION = "preemption", "Preemption (spot interruption notice)"
    CLUSTER_DRAINING = "cluster_draining", "Cluster drained by an operator"
    WORKER_LOST = "worker_lost", "Worker lost (no report)"
    CHUNK_FAILED = "chunk_failed", "Training chunk failed"
    # Provider calls.
    HTTP_429 = "http_429", "HTTP 429 (rate limited)"
    HTTP_5XX = "http_5xx", "HTTP 5xx"
    HTTP_4XX = "http_4xx", "HTTP 4xx (other than a client error)"
    TIMEOUT = "timeout", "Timeout"
    CONNECTION_ERROR = "connection_error", "Connection error"
    MALFORMED_RESPONSE = "malformed_response", "Malformed response"
    ENDPOINT_REFUSED = "endpoint_refused", "Endpoint refused by the outbound policy"
    QUALITY_DEMOTION = "quality_demotion", "Quality demotion"
    # Both.
    BUDGET_EXHAUSTED = "budget_exhausted", "Budget exhausted"
    CIRCUIT_OPEN = "circuit_open", "Circuit opened"
    CIRCUIT_CLOSED = "circuit_closed", "Circuit closed"
    # Rows recorded before codes existed whose reason matched nothing above, or a cause
    # nobody classified yet.
    OTHER = "other", "Other"


def failover_code_for_status(status: int | None) -> FailoverCode:
    """The code of a failed provider call that said only its HTTP status."""
    if status is None:
        return FailoverCode.OTHER
    if status == 429:
        return FailoverCode.HTTP_429
    if status == 408:
        return FailoverCode.TIMEOUT
    if status >= 500:
        return FailoverCode.HTTP_5XX
    if status >= 400:
        return FailoverCode.HTTP_4XX
    return FailoverCode.OTHER
