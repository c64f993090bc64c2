"""Alerts where ops teams are: channels (signed webhook, Slack, Teams), deduplication with quiet
periods, the daily spend digest per team and the spend anomaly detector.

One pipeline sends them all: sending is the one place an alert leaves (a webhook signed, through
the outbound guard, or an email; retried on transient failures; at most once under a row lock),
for the channels' deliveries and for a budget's own email and webhook alike.

The modules, lowest first: formats (each payload, pure), sending (to one destination), delivery
(what goes where, and the Celery tasks), raising (alert_raise: one delivery per subscribed
channel unless within its quiet period), channels (saving a channel, validating its URL),
digest, anomalies. Budget alerts come from billing.budgets.ledger_hook: to the budget's own
email and webhook (the billing.budget_alert_deliver task) and to the channels (alert_raise).
"""

from __future__ import annotations

from billing.alerts.anomalies import anomaly_verdict, spend_anomalies_detect
from billing.alerts.channels import AlertChannelInvalid, alert_channel_save, alert_channel_url_problem
from billing.alerts.delivery import (
    ALERT_DELIVERY_SEND,
    BUDGET_ALERT_DELIVER,
    alert_delivery_send,
    budget_alert_deliver,
)
from billing.alerts.digest import spend_digest_message, spend_digest_send
from billing.alerts.raising import AlertMessage, alert_raise
from billing.alerts.sending import (
    SIGNATURE_HEADER,
    SIGNATURE_TOLERANCE_S,
    TIMESTAMP_HEADER,
    AlertDeliveryError,
    webhook_signature_verify,
)

__all__ = [
    "ALERT_DELIVERY_SEND",
    "BUDGET_ALERT_DELIVER",
    "SIGNATURE_HEADER",
    "SIGNATURE_TOLERANCE_S",
    "TIMESTAMP_HEADER",
    "AlertChannelInvalid",
    "AlertDeliveryError",
    "AlertMessage",
    "alert_channel_save",
    "alert_channel_url_problem",
    "alert_delivery_send",
    "alert_raise",
    "budget_alert_deliver",
    "anomaly_verdict",
    "spend_anomalies_detect",
    "spend_digest_message",
    "spend_digest_send",
    "webhook_signature_verify",
]
