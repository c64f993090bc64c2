"""Failover events: recorded once, recovered with the time lost."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from registry.failover_codes import FailoverCode
from registry.models import (
    Cluster,
    Deployment,
    FailoverEvent,
    Provider,
)


def failover_event_record(
    *,
    kind: FailoverEvent.Kind,
    code: FailoverCode | str,
    reason: str,
    detected_at: datetime,
    from_provider: Provider | None = None,
    to_provider: Provider | None = None,
    from_cluster: Cluster | None = None,
    to_cluster: Cluster | None = None,
    from_deployment: Deployment | None = None,
    to_deployment: Deployment | None = None,
    subject: str = "",
    recovered_at: datetime | None = None,
    time_lost: timedelta | None = None,
    extra_cost: Decimal = Decimal("0"),
    currency: str = "USD",
    details: dict[str, object] | None = None,
    training_run_id: int | None = None,
    tokens_lost: int | None = None,
    status_code: int | None = None,
) -> FailoverEvent:
    """The only writer of FailoverEvent rows."""
    if from_cluster is not None and from_provider is None:
        from_provider = from_cluster.provider
    if to_cluster is not None and to_provider is None:
        to_provider = to_cluster.provider
    if from_deployment is not None and from_provider is None:
        from_provider = from_deployment.provider
    if to_deployment is not None and to_provider is None:
        to_provider = to_deployment.provider
    if time_lost is None and recovered_at is not None:
        time_lost = recovered_at - detected_at
    if code not in FailoverCode.values:
        raise ValueError(f"unknown failover code {code!r}")
    return FailoverEvent.objects.create(
        kind=kind,
        code=code,
        reason=reason[:500],
        detected_at=detected_at,
        recovered_at=recovered_at,
        time_lost=time_lost,
        from_provider=from_provider,
        to_provider=to_provider,
        from_cluster=from_cluster,
        to_cluster=to_cluster,
        from_deployment=from_deployment,
        to_deployment=to_deployment,
        subject=subject,
        extra_cost=extra_cost,
        currency=currency,
        details=details or {},
        training_run_id=training_run_id,
        tokens_lost=tokens_lost,
        status_code=status_code,
    )


def failover_event_recover(
    *, event: FailoverEvent, recovered_at: datetime, to_cluster: Cluster | None = None
) -> FailoverEvent:
    """Close an open event: when it recovered and how long was lost."""
    event.recovered_at = recovered_at
    event.time_lost = recovered_at - event.detected_at
    fields = ["recovered_at", "time_lost"]
    if to_cluster is not None:
        event.to_cluster = to_cluster
        event.to_provider = to_cluster.provider
        fields += ["to_cluster", "to_provider"]
    event.save(update_fields=fields)
    return event
