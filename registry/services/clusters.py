"""Clusters: created and changed here (the API, the page form and the Django admin call these);
their health: worker heartbeats, the health check, draining and interruption notices."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from registry.crypto import encrypt_secret
from registry.failover_codes import FailoverCode
from registry.models import (
    Cluster,
    FailoverEvent,
    WorkerHeartbeat,
)
from registry.services.errors import RegistryError, RegistryFieldsError
from registry.services.failovers import failover_event_record, failover_event_recover
from registry.services.records import fields_assign
from registry.store.cluster_stores import (
    cluster_store_credentials_problem,
    cluster_store_endpoint_problem,
    cluster_store_url_problem,
)

logger = logging.getLogger(__name__)


def cluster_heartbeat(
    *, cluster_slug: str, hostname: str, pid: int, started_at: datetime, devices: list[int] | None = None
) -> Cluster | None:
    """Record that a worker of the cluster is alive (and the devices it offers); a silent
    cluster turns healthy.

    Returns None when the cluster no longer exists (the worker keeps running, it
    just has nothing to report to).
    """
    now = timezone.now()
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update().filter(slug=cluster_slug).first()
        if cluster is None:
            return None
        WorkerHeartbeat.objects.update_or_create(
            cluster=cluster,
            hostname=hostname,
            defaults={"pid": pid, "started_at": started_at, "last_seen_at": now, "devices": devices or []},
        )
        cluster.last_heartbeat_at = now
        fields = ["last_heartbeat_at"]
        if cluster.status in (Cluster.Status.DOWN, Cluster.Status.DEGRADED):
            _cluster_recovered(cluster=cluster, now=now)
            cluster.status = Cluster.Status.HEALTHY
            cluster.status_changed_at = now
            fields += ["status", "status_changed_at"]
        cluster.save(update_fields=fields)
    return cluster


def _cluster_recovered(*, cluster: Cluster, now: datetime) -> None:
    open_events = FailoverEvent.objects.filter(
        kind=FailoverEvent.Kind.CLUSTER_HEALTH, from_cluster=cluster, recovered_at__isnull=True
    )
    for event in open_events:
        failover_event_recover(event=event, recovered_at=now)


@dataclass(frozen=True)
class HealthTransition:
    cluster_slug: str
    old: str
    new: str


def cluster_health_check(*, now: datetime | None = None) -> list[HealthTransition]:
    """Derive each cluster's status from its last heartbeat.

    healthy → degraded after DEGRADED_AFTER_SECONDS of silence, → down after
    DOWN_AFTER_SECONDS; going down records a cluster-health FailoverEvent.
    Draining clusters are left alone: an operator owns that state.
    """
    now = now or timezone.now()
    degraded_before = now - timedelta(seconds=settings.DEGRADED_AFTER_SECONDS)
    down_before = now - timedelta(seconds=settings.DOWN_AFTER_SECONDS)
    transitions: list[HealthTransition] = []
    candidates = Cluster.objects.filter(status__in=[Cluster.Status.HEALTHY, Cluster.Status.DEGRADED]).filter(
        Q(last_heartbeat_at__isnull=True) | Q(last_heartbeat_at__lt=degraded_before)
    )
    for cluster_id in candidates.values_list("id", flat=True):
        with transaction.atomic():
            # Re-read under a lock: a heartbeat may have landed since the scan.
            cluster = Cluster.objects.select_for_update().select_related("provider").get(id=cluster_id)
            last = cluster.last_heartbeat_at
            if cluster.status not in (Cluster.Status.HEALTHY, Cluster.Status.DEGRADED):
                continue
            if last is not None and last >= degraded_before:
                continue
            new = Cluster.Status.DOWN if last is None or last < down_before else Cluster.Status.DEGRADED
            if new == cluster.status:
                continue
            old = cluster.status
            cluster.status = new
            cluster.status_changed_at = now
            cluster.save(update_fields=["status", "status_changed_at"])
            if new == Cluster.Status.DOWN:
                silent = "never" if last is None else f"{(now - last).total_seconds():.0f}s"
                failover_event_record(
                    kind=FailoverEvent.Kind.CLUSTER_HEALTH,
                    code=FailoverCode.HEARTBEAT_TIMEOUT,
                    reason=f"{old} → down: no worker heartbeat for {silent}",
                    detected_at=now,
                    from_cluster=cluster,
                    subject=f"cluster:{cluster.slug}",
                    details={"previous_status": old, "last_heartbeat_at": last.isoformat() if last else None},
                )
            transitions.append(HealthTransition(cluster.slug, old, new))
            logger.warning("cluster %s: %s → %s", cluster.slug, old, new)
    return transitions


def cluster_set_draining(*, cluster: Cluster, draining: bool) -> Cluster:
    now = timezone.now()
    fields = ["status", "status_changed_at"]
    if draining:
        cluster.status = Cluster.Status.DRAINING
    else:
        # Back to what the heartbeats say: healthy only if one arrived recently,
        # so resuming a silent cluster does not claim it is alive.
        last = cluster.last_heartbeat_at
        recent = last is not None and (now - last).total_seconds() <= settings.DEGRADED_AFTER_SECONDS
        cluster.status = Cluster.Status.HEALTHY if recent else Cluster.Status.DOWN
        # Resuming ends an interruption notice too: the provider gave the capacity back.
        cluster.interruption_noticed_at = cluster.interruption_deadline = None
        fields += ["interruption_noticed_at", "interruption_deadline"]
    cluster.status_changed_at = now
    cluster.save(update_fields=fields)
    return cluster


# AWS gives a spot instance two minutes' notice (EC2 "spot instance interruption notices"),
# Google Cloud 30 s (preemption notice); a notice without a deadline assumes the longer one.
INTERRUPTION_DEFAULT_SECONDS = 120
# A deadline further out than this is not an interruption but a maintenance window: drain instead.
INTERRUPTION_MAX_SECONDS = 3600


def cluster_interruption_notice(
    *, cluster: Cluster, deadline: datetime | None = None, now: datetime | None = None
) -> Cluster:
    """A spot cluster will be reclaimed at `deadline`: drain it now, so that placement avoids it,
    its learners push their deltas and stop, and the training supervisor moves them elsewhere.

    Refuses (RegistryError, with the field) a cluster that is not spot capacity and a deadline
    that is past or more than an hour away. A second notice keeps the earlier deadline when it is
    sooner (a notice never buys time).
    """
    now = now or timezone.now()
    if cluster.capacity_type != Cluster.CapacityType.SPOT:
        raise RegistryError(
            f"cluster {cluster.slug} is {cluster.capacity_type} capacity; only a spot cluster is interrupted "
            "(drain it instead)",
            field="cluster",
        )
    if deadline is None:
        deadline = now + timedelta(seconds=INTERRUPTION_DEFAULT_SECONDS)
    if deadline <= now:
        raise RegistryError("the deadline has passed; give a time in the future", field="deadline")
    if deadline > now + timedelta(seconds=INTERRUPTION_MAX_SECONDS):
        raise RegistryError(
            f"at most {INTERRUPTION_MAX_SECONDS // 60} minutes ahead (a later reclaim is maintenance: drain)",
            field="deadline",
        )
    with transaction.atomic():
        locked = Cluster.objects.select_for_update().get(pk=cluster.pk)
        if locked.interruption_deadline is not None and locked.interruption_deadline < deadline:
            deadline = locked.interruption_deadline
        if locked.interruption_noticed_at is None:
            locked.interruption_noticed_at = now
        locked.interruption_deadline = deadline
        if locked.status != Cluster.Status.DRAINING:
            locked.status = Cluster.Status.DRAINING
            locked.status_changed_at = now
        locked.save(
            update_fields=["interruption_noticed_at", "interruption_deadline", "status", "status_changed_at"]
        )
    logger.warning("cluster %s: spot interruption notice, reclaimed at %s", locked.slug, deadline.isoformat())
    return locked


# What a caller sets, in the order the page forms show them (registry.forms reads this).
CLUSTER_FIELDS = (
    "provider",
    "slug",
    "region",
    "accelerator_type",
    "accelerator_count",
    "memory_per_node_gb",
    "capacity_type",
    "capacity",
    "object_store_url",
    "object_store_endpoint_url",
)


def cluster_store_url_check(url: str) -> None:
    """A cluster's own store is an s3:// bucket or a directory under CLUSTER_STORE_FILE_ROOT."""
    if problem := cluster_store_url_problem(url):
        raise RegistryError(problem, field="object_store_url")


def cluster_store_endpoint_check(url: str) -> None:
    """A cluster store's endpoint is an http(s) URL without credentials, query or fragment."""
    if problem := cluster_store_endpoint_problem(url):
        raise RegistryError(problem, field="object_store_endpoint_url")


def cluster_store_credentials_check(credentials: str | None) -> None:
    """The store's credentials are ACCESS_KEY_ID:SECRET_ACCESS_KEY ('' clears, None keeps them)."""
    if credentials and (problem := cluster_store_credentials_problem(credentials)):
        raise RegistryError(problem, field="object_store_credentials")


def cluster_check(cluster: Cluster, *, credentials: str | None = None) -> None:
    """A cluster's rules, on the state it would be saved with; every refused field is named."""
    errors: dict[str, list[str]] = {}
    checks: list[Callable[[], None]] = [
        lambda: cluster_store_url_check(cluster.object_store_url),
        lambda: cluster_store_endpoint_check(cluster.object_store_endpoint_url),
        lambda: cluster_store_credentials_check(credentials),
    ]
    for check in checks:
        try:
            check()
        except RegistryError as exc:
            errors.update(exc.field_errors())
    if cluster.object_store_endpoint_url and not cluster.object_store_url.startswith("s3://"):
        errors.setdefault("object_store_endpoint_url", []).append("only an s3:// store has an endpoint")
    if errors:
        raise RegistryFieldsError(errors)


def _cluster_save(cluster: Cluster, credentials: str | None) -> Cluster:
    cluster_check(cluster, credentials=credentials)
    if credentials is not None:
        cluster.object_store_credentials_encrypted = encrypt_secret(credentials) if credentials else ""
    cluster.save()
    return cluster


def cluster_create(*, object_store_credentials: str | None = None, **fields: Any) -> Cluster:
    """A new cluster of `fields` (CLUSTER_FIELDS); its status follows its workers' heartbeats.
    `object_store_credentials` (ACCESS_KEY_ID:SECRET) are stored encrypted, never shown again."""
    return _cluster_save(fields_assign(Cluster(), fields, CLUSTER_FIELDS), object_store_credentials)


def cluster_update(
    cluster: Cluster, *, object_store_credentials: str | None = None, **fields: Any
) -> Cluster:
    """Change the given fields (`object_store_credentials`: '' clears them, None keeps them);
    the status changes only through heartbeats, draining and interruption notices (above)."""
    return _cluster_save(fields_assign(cluster, fields, CLUSTER_FIELDS), object_store_credentials)
