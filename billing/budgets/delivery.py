"""Alert delivery: each alert sent by email and signed webhook at most once, retried on transient failures."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass
from smtplib import SMTPException
from typing import Any

from celery import shared_task
from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from billing.budgets.errors import AlertDeliveryError
from billing.budgets.writes import email_addresses
from billing.models import BudgetAlert
from stack.registry.crypto import decrypt_secret
from stack.registry.outbound import PUBLIC_ONLY, OutboundRefused, http_post

logger = logging.getLogger(__name__)

WEBHOOK_TIMEOUT_S = 5.0  # connect, then each read: the alert row stays locked while we wait
SIGNATURE_HEADER = "X-Switchyard-Signature"
TIMESTAMP_HEADER = "X-Switchyard-Timestamp"
# How far a receiver should let a webhook's timestamp be from its own clock (docs/billing.md,
# "Budgets"): a captured request replayed later than this is refused.
SIGNATURE_TOLERANCE_S = 300


@dataclass(frozen=True)
class WebhookOutcome:
    """One POST of an alert: `sent` on a 2xx; `failure` (to retry) when unreachable, 5xx or
    429; `status` what the row records ("... (not retried)" when sending again won't help)."""

    sent: bool
    status: str
    failure: str = ""


def webhook_post(url: str, *, body: bytes, headers: dict[str, str]) -> WebhookOutcome:
    """POST an alert through the outbound guard (loopback, private and link-local addresses only
    inside SWITCHYARD_OUTBOUND_ALLOW_NETWORKS; redirects not followed), and say what came of it.
    Budget webhooks and alert channels share it, so they retry and give up alike."""
    try:
        answer = http_post(url, body=body, headers=headers, timeout=WEBHOOK_TIMEOUT_S, policy=PUBLIC_ONLY)
    except OutboundRefused as exc:
        # Sending it again will not help until an admin allows the network.
        logger.warning("alert webhook refused: %s", exc.detail)
        return WebhookOutcome(sent=False, status="refused by the outbound policy (not retried)")
    except OSError as exc:
        failure = type(exc).__name__
        return WebhookOutcome(sent=False, status=failure[:200], failure=failure)
    code = answer.status
    if 200 <= code < 300:
        return WebhookOutcome(sent=True, status=f"HTTP {code}")
    if code >= 500 or code == 429:
        return WebhookOutcome(sent=False, status=f"HTTP {code}", failure=f"HTTP {code}")
    # The receiver refused this request; sending it again will not help.
    return WebhookOutcome(sent=False, status=f"HTTP {code} (refused; not retried)")


def budget_alert_payload(*, alert: BudgetAlert) -> dict[str, Any]:
    """The webhook's JSON body for an alert."""
    budget = alert.budget
    return {
        "alert_id": alert.pk,
        "budget_id": budget.pk,
        "budget": budget.name,
        "scope": budget.scope,
        "threshold_percent": alert.threshold_percent,
        "spent": str(alert.spent),
        "limit": str(alert.limit_amount),
        "currency": budget.currency,
        "hard_limit": budget.hard_limit,
        "period_start": alert.period_start.isoformat(),
        "triggered_at": alert.triggered_at.isoformat(),
    }


def budget_webhook_signature(*, secret: str, body: bytes, timestamp: str) -> str:
    """The X-Switchyard-Signature value: sha256=<hex HMAC-SHA256 of `<timestamp>.<body>`>, the
    timestamp being X-Switchyard-Timestamp's (Unix seconds), so a replayed request can be told
    by its age and a changed timestamp breaks the signature."""
    signed = timestamp.encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def webhook_signed_headers(*, secret: str, body: bytes) -> dict[str, str]:
    """The timestamp and signature headers of a signed webhook (budgets and alert channels)."""
    timestamp = str(int(timezone.now().timestamp()))
    return {
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: budget_webhook_signature(secret=secret, body=body, timestamp=timestamp),
    }


def webhook_signature_verify(
    *,
    secret: str,
    body: bytes,
    timestamp: str,
    signature: str,
    tolerance_s: int = SIGNATURE_TOLERANCE_S,
) -> bool:
    """What a receiver does (the reference for docs/billing.md's recipe): the signature matches
    `<timestamp>.<body>` (compared in constant time) and the timestamp is within `tolerance_s`
    of now. A receiver should also drop an alert_id / delivery_id it has already handled."""
    try:
        sent_at = int(timestamp)
    except ValueError:
        return False
    if abs(timezone.now().timestamp() - sent_at) > tolerance_s:
        return False
    expected = budget_webhook_signature(secret=secret, body=body, timestamp=timestamp)
    return hmac.compare_digest(expected.encode(), signature.encode())


def budget_alert_deliver(*, alert_id: int) -> None:
    """Send an alert by email and webhook, each at most once; raise AlertDeliveryError to retry.

    Each channel claims the alert row with SELECT ... FOR UPDATE and records
    its sent time in the same transaction, so a re-run (or a second worker)
    finds it sent and does nothing. A failure of one channel does not stop
    the other; a transient failure is raised after both were tried.
    """
    failures = [f for f in (_deliver_email(alert_id), _deliver_webhook(alert_id)) if f]
    if failures:
        raise AlertDeliveryError(f"alert {alert_id}: " + "; ".join(failures))


def _claim(alert_id: int) -> BudgetAlert | None:
    """The alert row, locked until the caller's transaction ends (None if it is gone)."""
    return (
        BudgetAlert.objects.select_for_update(of=("self",))
        .select_related("budget")
        .filter(pk=alert_id)
        .first()
    )


def _deliver_email(alert_id: int) -> str:
    with transaction.atomic():
        alert = _claim(alert_id)
        if alert is None or alert.email_sent_at is not None or not email_addresses(alert.budget.email_to):
            return ""
        budget = alert.budget
        subject = f"[Switchyard] budget {budget.name} reached {alert.threshold_percent}%"
        body = (
            f"Budget {budget.name!r} ({budget.get_scope_display()}) has spent {alert.spent} of its "
            f"{alert.limit_amount} {budget.currency} limit for the period starting "
            f"{alert.period_start:%Y-%m-%d %H:%M} UTC ({alert.threshold_percent}% threshold).\n"
        )
        if budget.hard_limit and alert.threshold_percent >= 100:
            body += "It is a hard limit: new spending under it is refused until the next period.\n"
        try:
            send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, email_addresses(budget.email_to))
        except (SMTPException, OSError) as exc:
            logger.warning("budget alert %s: email failed: %s", alert_id, exc)
            return f"email: {type(exc).__name__}: {exc}"
        alert.email_sent_at = timezone.now()
        alert.save(update_fields=["email_sent_at"])
    return ""


def _deliver_webhook(alert_id: int) -> str:
    failure = ""
    with transaction.atomic():
        alert = _claim(alert_id)
        if alert is None or alert.webhook_sent_at is not None or not alert.budget.webhook_url:
            return ""
        budget = alert.budget
        if not budget.webhook_secret_encrypted:
            alert.webhook_status = "not sent: the budget has no webhook secret"
            alert.save(update_fields=["webhook_status"])
            return ""
        body = json.dumps(budget_alert_payload(alert=alert), sort_keys=True, separators=(",", ":")).encode()
        headers = {
            "Content-Type": "application/json",
            **webhook_signed_headers(secret=decrypt_secret(budget.webhook_secret_encrypted), body=body),
        }
        outcome = webhook_post(budget.webhook_url, body=body, headers=headers)
        alert.webhook_status = outcome.status if not outcome.failure else f"webhook: {outcome.failure}"[:200]
        if outcome.sent:
            alert.webhook_sent_at = timezone.now()
        if outcome.failure:
            failure = f"webhook: {outcome.failure}"
        alert.save(update_fields=["webhook_sent_at", "webhook_status"])
    if failure:
        logger.warning("budget alert %s: %s", alert_id, failure)
    return failure


# Defined here, next to the work it runs, so that the ledger hook can enqueue it without
# importing billing.tasks (which imports this package: the arrow would point both ways).
@shared_task(
    name="billing.budget_alert_deliver",
    ignore_result=True,
    # No queue= (deprecated in Celery 5.x): it goes to CELERY_TASK_DEFAULT_QUEUE, "control".
    # Only transient delivery failures (SMTP or webhook unreachable, 5xx, 429)
    # are retried, with exponential backoff capped at 10 minutes, 8 times.
    autoretry_for=(AlertDeliveryError,),
    retry_backoff=True,
    retry_backoff_max=600,
    retry_jitter=True,
    max_retries=8,
)
def budget_alert_deliver_task(alert_id: int) -> None:
    """Email and webhook for one budget alert; each channel is sent at most once."""
    budget_alert_deliver(alert_id=alert_id)
