"""Sending one AlertDelivery to its channel, at most once, retried on transient failures.

Slack and Teams webhooks authenticate by their secret URL; the generic webhook is signed like a
budget's (X-Switchyard-Timestamp, and X-Switchyard-Signature: HMAC-SHA256 of `<timestamp>.<body>`
with the channel's secret, so a receiver refuses a replay by its age). Every URL
goes through the outbound guard (stack.registry.outbound): no loopback, private, link-local or
metadata address unless an admin listed its network, and redirects are not followed.
"""

from __future__ import annotations

import json
import logging

from celery import shared_task
from django.db import transaction
from django.utils import timezone

from billing.alerts.formats import generic_body, slack_body, teams_body
from billing.budgets.delivery import webhook_post, webhook_signed_headers
from billing.budgets.errors import AlertDeliveryError
from billing.models import AlertChannel, AlertDelivery
from stack.registry.crypto import decrypt_secret

logger = logging.getLogger(__name__)


def _body(delivery: AlertDelivery) -> tuple[bytes, dict[str, str]]:
    channel = delivery.channel
    headers = {"Content-Type": "application/json"}
    if channel.kind == AlertChannel.Kind.SLACK:
        doc = slack_body(message=delivery.message)
    elif channel.kind == AlertChannel.Kind.TEAMS:
        doc = teams_body(message=delivery.message)
    else:
        doc = generic_body(
            message=delivery.message,
            kind=delivery.kind,
            dedup_key=delivery.dedup_key,
            delivery_id=delivery.pk,
            at=delivery.created_at.isoformat(),
        )
    body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    if channel.kind == AlertChannel.Kind.WEBHOOK:
        headers.update(webhook_signed_headers(secret=decrypt_secret(channel.secret_encrypted), body=body))
    return body, headers


def alert_delivery_send(*, delivery_id: int) -> None:
    """Send one delivery; a re-run after it was sent (or refused for good) does nothing.
    Raises AlertDeliveryError on a transient failure (unreachable, 5xx, 429) to be retried."""
    failure = ""
    with transaction.atomic():
        delivery = (
            AlertDelivery.objects.select_for_update(of=("self",))
            .select_related("channel")
            .filter(pk=delivery_id)
            .first()
        )
        if delivery is None or delivery.sent_at is not None or "not retried" in delivery.status:
            return  # sent, or refused for good (the outbound policy, a 4xx): sending again won't help
        body, headers = _body(delivery)
        outcome = webhook_post(decrypt_secret(delivery.channel.url_encrypted), body=body, headers=headers)
        delivery.status, failure = outcome.status, outcome.failure
        if outcome.sent:
            delivery.sent_at = timezone.now()
        delivery.save(update_fields=["sent_at", "status"])
    if failure:
        logger.warning("alert delivery %s: %s", delivery_id, failure)
        raise AlertDeliveryError(f"alert delivery {delivery_id}: {failure}")


@shared_task(
    name="billing.alert_delivery_send",
    ignore_result=True,
    # Only transient failures, with exponential backoff capped at 10 minutes, 8 times (as budgets).
    autoretry_for=(AlertDeliveryError,),
    retry_backoff=True,
    retry_backoff_max=600,
    retry_jitter=True,
    max_retries=8,
)
def alert_delivery_send_task(delivery_id: int) -> None:
    alert_delivery_send(delivery_id=delivery_id)
