"""Delivering alerts: each AlertDelivery to its channel, and a budget alert to the budget's own
email and webhook. Both send through billing.alerts.sending (signing, the outbound guard, the
retry policy, at most once under a row lock); this module says what each one sends where.

Slack and Teams webhooks authenticate by their secret URL; a generic channel webhook is signed
with the channel's secret, a budget's webhook with the budget's.
"""

from __future__ import annotations

from billing.alerts.formats import (
    budget_alert_email,
    budget_alert_payload,
    generic_body,
    slack_body,
    teams_body,
)
from billing.alerts.sending import (
    AlertDeliveryError,
    Outcome,
    Record,
    deliver_once,
    email_addresses,
    email_send,
    webhook_send,
)
from billing.models import AlertChannel, AlertDelivery, BudgetAlert
from registry.crypto import decrypt_secret

CHANNEL = Record(sent_at="sent_at", status="status")
BUDGET_EMAIL = Record(sent_at="email_sent_at", label="email")
BUDGET_WEBHOOK = Record(sent_at="webhook_sent_at", status="webhook_status", label="webhook")

# The tasks (billing.tasks) are registered under these names; queued messages carry them: keep them.
ALERT_DELIVERY_SEND = "billing.alert_delivery_send"
BUDGET_ALERT_DELIVER = "billing.budget_alert_deliver"


def _to_channel(delivery: AlertDelivery) -> Outcome:
    channel = delivery.channel
    url = decrypt_secret(channel.url_encrypted)
    if channel.kind == AlertChannel.Kind.SLACK:
        return webhook_send(url=url, doc=slack_body(message=delivery.message))
    if channel.kind == AlertChannel.Kind.TEAMS:
        return webhook_send(url=url, doc=teams_body(message=delivery.message))
    doc = generic_body(
        message=delivery.message,
        kind=delivery.kind,
        dedup_key=delivery.dedup_key,
        delivery_id=delivery.pk,
        at=delivery.created_at.isoformat(),
    )
    return webhook_send(url=url, doc=doc, secret=decrypt_secret(channel.secret_encrypted))


def alert_delivery_send(*, delivery_id: int) -> None:
    """Send one delivery; a re-run after it was sent (or refused for good) does nothing.
    Raises AlertDeliveryError on a transient failure (unreachable, 5xx, 429) to be retried."""
    rows = AlertDelivery.objects.select_related("channel")
    failure = deliver_once(rows=rows, pk=delivery_id, record=CHANNEL, send=_to_channel)
    if failure:
        raise AlertDeliveryError(f"alert delivery {delivery_id}: {failure}")


def _by_email(alert: BudgetAlert) -> Outcome | None:
    to = email_addresses(alert.budget.email_to)
    if not to:
        return None
    subject, body = budget_alert_email(alert=alert)
    return email_send(to=to, subject=subject, body=body)


def _by_webhook(alert: BudgetAlert) -> Outcome | None:
    budget = alert.budget
    if not budget.webhook_url:
        return None
    if not budget.webhook_secret_encrypted:
        return Outcome(sent=False, status="not sent: the budget has no webhook secret")
    secret = decrypt_secret(budget.webhook_secret_encrypted)
    return webhook_send(url=budget.webhook_url, doc=budget_alert_payload(alert=alert), secret=secret)


def budget_alert_deliver(*, alert_id: int) -> None:
    """Send a budget alert to the budget's own email and webhook, each at most once; raise
    AlertDeliveryError to retry. A failure of one does not stop the other; a transient failure
    is raised after both were tried. (The alert channels' copy is an AlertDelivery each.)"""
    rows = BudgetAlert.objects.select_related("budget")
    failures = [
        failure
        for record, send in ((BUDGET_EMAIL, _by_email), (BUDGET_WEBHOOK, _by_webhook))
        if (failure := deliver_once(rows=rows, pk=alert_id, record=record, send=send))
    ]
    if failures:
        raise AlertDeliveryError(f"alert {alert_id}: " + "; ".join(failures))
