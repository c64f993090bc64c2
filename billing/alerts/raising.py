"""Raising an alert: one delivery per subscribed channel, unless the channel heard about the same
subject within its quiet period (then the repeat is counted on the earlier delivery instead).

One incident raises one alert: every alert names its subject with a dedup key (a budget and
period, an anomaly's target, a digest's team and day). Each channel's row is locked while its
latest delivery for the key is looked up and a new one is inserted, so two workers raising the
same alert at once still make one delivery.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q

from billing.alerts.delivery import ALERT_DELIVERY_SEND
from billing.models import AlertChannel, AlertDelivery, AlertKind
from registry.queues import CONTROL_QUEUE, task_send

SUBSCRIPTION_FIELD = {
    AlertKind.BUDGET: "budget_alerts",
    AlertKind.ANOMALY: "anomaly_alerts",
    AlertKind.DIGEST: "daily_digest",
}


@dataclass(frozen=True)
class AlertMessage:
    title: str
    text: str = ""
    facts: list[tuple[str, str]] = field(default_factory=list)
    path: str = ""  # a page of Switchyard's, made absolute with SWITCHYARD_PUBLIC_URL when set

    def as_json(self) -> dict[str, Any]:
        base = settings.SWITCHYARD_PUBLIC_URL
        return {
            "title": self.title,
            "text": self.text,
            "facts": [[label, value] for label, value in self.facts],
            "link": f"{base.rstrip('/')}{self.path}" if base and self.path else "",
        }


def alert_raise(
    *,
    kind: AlertKind,
    dedup_key: str,
    message: AlertMessage,
    now: datetime,
    team: str | None = None,
    once: bool = False,
) -> list[AlertDelivery]:
    """Queue the alert for each active channel subscribed to `kind`; returns the new deliveries.

    A channel that got an alert with the same `dedup_key` within its quiet period gets none: the
    earlier delivery's `repeats` counts it. `once` makes the key final (a digest of one day is
    sent once, whenever it is raised again). `team` limits a digest to channels that take every
    team's digest or that team's. Sending happens after commit (billing.alerts.delivery).
    """
    channels = AlertChannel.objects.filter(active=True, **{SUBSCRIPTION_FIELD[kind]: True})
    if team is not None:
        channels = channels.filter(Q(digest_team="") | Q(digest_team=team))
    created: list[AlertDelivery] = []
    with transaction.atomic():
        for channel in channels.select_for_update().order_by("pk"):
            earlier = AlertDelivery.objects.filter(channel=channel, dedup_key=dedup_key)
            if not once:
                earlier = earlier.filter(created_at__gt=now - timedelta(seconds=channel.quiet_period_seconds))
            latest = earlier.order_by("-created_at", "-id").first()
            if latest is not None:
                AlertDelivery.objects.filter(pk=latest.pk).update(
                    repeats=F("repeats") + 1, last_repeat_at=now
                )
                continue
            delivery = AlertDelivery.objects.create(
                channel=channel, kind=kind, dedup_key=dedup_key, message=message.as_json(), created_at=now
            )
            created.append(delivery)
            transaction.on_commit(
                functools.partial(task_send, ALERT_DELIVERY_SEND, delivery.pk, queue=CONTROL_QUEUE)
            )
    return created
