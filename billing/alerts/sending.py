"""Sending one alert to one destination: the one place every alert leaves Switchyard.

Alert channels (Slack, Teams, signed webhooks) and a budget's own email and webhook all go
through here, so they sign, retry and give up alike:

* a webhook's body is compact JSON with sorted keys; a signed one carries X-Switchyard-Timestamp
  (Unix seconds) and X-Switchyard-Signature (sha256=<HMAC-SHA256 of `<timestamp>.<body>`>), so a
  receiver refuses a replay by its age (webhook_signature_verify is the recipe);
* every URL goes through the outbound guard (registry.outbound.guard): no loopback, private,
  link-local or metadata address unless an admin listed its network, and no redirects;
* a 2xx is sent; unreachable, a 5xx or a 429 is transient (AlertDeliveryError, retried by the
  tasks with DELIVERY_RETRY's backoff); a refusal (another 4xx, the outbound policy) is final,
  and its status says "not retried";
* deliver_once claims the row that records the delivery, sends unless it was sent or refused
  for good, and records the outcome in the same transaction: at most once, whoever runs it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from smtplib import SMTPException
from typing import Any, TypeVar

from django.conf import settings
from django.core.mail import send_mail
from django.db import models, transaction
from django.utils import timezone

from registry.outbound.guard import PUBLIC_ONLY, OutboundRefused, http_post

logger = logging.getLogger(__name__)

WEBHOOK_TIMEOUT_S = 5.0  # connect, then each read: the delivery's row stays locked while we wait
SIGNATURE_HEADER = "X-Switchyard-Signature"
TIMESTAMP_HEADER = "X-Switchyard-Timestamp"
# How far a receiver should let a webhook's timestamp be from its own clock (docs/billing.md,
# "Budgets"): a captured request replayed later than this is refused.
SIGNATURE_TOLERANCE_S = 300
FINAL = "not retried"  # in a status: refused for good, sending again won't help


class AlertDeliveryError(Exception):
    """A transient failure sending an alert (SMTP or webhook unreachable, 5xx, 429): retry later."""


# The delivery tasks' retry policy: only transient failures, with exponential backoff capped at
# 10 minutes, 8 times. No queue= (deprecated in Celery 5.x): CELERY_TASK_DEFAULT_QUEUE, "control".
DELIVERY_RETRY: dict[str, Any] = {
    "ignore_result": True,
    "autoretry_for": (AlertDeliveryError,),
    "retry_backoff": True,
    "retry_backoff_max": 600,
    "retry_jitter": True,
    "max_retries": 8,
}


@dataclass(frozen=True)
class Outcome:
    """One send: `sent` on success; `failure` (to retry) when transient; `status` what the row
    records ("... (not retried)" when sending again won't help)."""

    sent: bool
    status: str
    failure: str = ""


def webhook_signature(*, secret: str, body: bytes, timestamp: str) -> str:
    """The X-Switchyard-Signature value: sha256=<hex HMAC-SHA256 of `<timestamp>.<body>`>, the
    timestamp being X-Switchyard-Timestamp's (Unix seconds), so a replayed request can be told
    by its age and a changed timestamp breaks the signature."""
    signed = timestamp.encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def webhook_signed_headers(*, secret: str, body: bytes) -> dict[str, str]:
    """The timestamp and signature headers of a signed webhook."""
    timestamp = str(int(timezone.now().timestamp()))
    return {
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: webhook_signature(secret=secret, body=body, timestamp=timestamp),
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
    expected = webhook_signature(secret=secret, body=body, timestamp=timestamp)
    return hmac.compare_digest(expected.encode(), signature.encode())


def webhook_send(*, url: str, doc: dict[str, Any], secret: str = "") -> Outcome:
    """POST `doc` as JSON to `url` through the outbound guard, signed when `secret` is given
    (Slack and Teams authenticate by their secret URL instead), and say what came of it."""
    body = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json"}
    if secret:
        headers.update(webhook_signed_headers(secret=secret, body=body))
    try:
        answer = http_post(url, body=body, headers=headers, timeout=WEBHOOK_TIMEOUT_S, policy=PUBLIC_ONLY)
    except OutboundRefused as exc:
        # Sending it again will not help until an admin allows the network.
        logger.warning("alert webhook refused: %s", exc.detail)
        return Outcome(sent=False, status=f"refused by the outbound policy ({FINAL})")
    except OSError as exc:
        failure = type(exc).__name__
        return Outcome(sent=False, status=failure[:200], failure=failure)
    code = answer.status
    if 200 <= code < 300:
        return Outcome(sent=True, status=f"HTTP {code}")
    if code >= 500 or code == 429:
        return Outcome(sent=False, status=f"HTTP {code}", failure=f"HTTP {code}")
    # The receiver refused this request; sending it again will not help.
    return Outcome(sent=False, status=f"HTTP {code} (refused; {FINAL})")


def email_addresses(email_to: str) -> list[str]:
    """The addresses in a comma-separated list (a budget's email_to)."""
    return [a.strip() for a in email_to.split(",") if a.strip()]


def email_send(*, to: list[str], subject: str, body: str) -> Outcome:
    """Mail through Django's backend; an SMTP error or an unreachable server is transient."""
    try:
        send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, to)
    except (SMTPException, OSError) as exc:
        failure = f"{type(exc).__name__}: {exc}"
        return Outcome(sent=False, status=failure[:200], failure=failure)
    return Outcome(sent=True, status="sent")


@dataclass(frozen=True)
class Record:
    """Where a destination's deliveries are recorded on their row: the field set when sent, the
    field holding the last outcome ("": none), and the label its failures are named by."""

    sent_at: str
    status: str = ""
    label: str = ""


M = TypeVar("M", bound=models.Model)


def deliver_once(
    *, rows: models.QuerySet[M], pk: int, record: Record, send: Callable[[M], Outcome | None]
) -> str:
    """Send row `pk`'s delivery unless it was sent or refused for good; returns the transient
    failure to retry ("" when none). `send` returns None when the row has nowhere to go.

    The row is claimed with SELECT ... FOR UPDATE and its outcome recorded in the same
    transaction, so a re-run (or a second worker) finds it sent and does nothing. The lock is
    held while sending (WEBHOOK_TIMEOUT_S bounds each wait). Not registry.claims: a conditional
    UPDATE would end the claim before the send, and need a "sending" state and a stale bound for
    a worker that dies mid-send; the lock's transaction gives both for free."""
    with transaction.atomic():
        row = rows.select_for_update(of=("self",)).filter(pk=pk).first()
        if row is None or getattr(row, record.sent_at) is not None:
            return ""  # gone, or sent
        if record.status and FINAL in getattr(row, record.status):
            return ""  # refused for good (the outbound policy, a 4xx): sending again won't help
        outcome = send(row)
        if outcome is None:
            return ""
        failure = (
            f"{record.label}: {outcome.failure}" if record.label and outcome.failure else outcome.failure
        )
        fields = [record.sent_at]
        if outcome.sent:
            setattr(row, record.sent_at, timezone.now())
        if record.status:
            setattr(row, record.status, (failure or outcome.status)[:200])
            fields.append(record.status)
        row.save(update_fields=fields)
    if failure:
        logger.warning("%s %s: %s", rows.model._meta.model_name, pk, failure)
    return failure
