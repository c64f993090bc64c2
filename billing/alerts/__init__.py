"""Alerts where ops teams are: channels (signed webhook, Slack, Teams), deduplication with quiet
periods, the daily spend digest per team and the spend anomaly detector.

The modules, lowest first: formats (each channel's payload, pure), raising (alert_raise: one
delivery per subscribed channel unless within its quiet period), delivery (sending, and its
Celery task), channels (saving a channel, validating its URL), digest, anomalies. Budget alerts
reach the channels from billing.budgets.ledger_hook.
"""

from __future__ import annotations

from billing.alerts.anomalies import anomaly_verdict, spend_anomalies_detect
from billing.alerts.channels import AlertChannelInvalid, alert_channel_save, alert_channel_url_problem
from billing.alerts.delivery import alert_delivery_send, alert_delivery_send_task
from billing.alerts.digest import spend_digest_message, spend_digest_send
from billing.alerts.raising import AlertMessage, alert_raise

__all__ = [
    "AlertChannelInvalid",
    "AlertMessage",
    "alert_channel_save",
    "alert_channel_url_problem",
    "alert_delivery_send",
    "alert_delivery_send_task",
    "alert_raise",
    "anomaly_verdict",
    "spend_anomalies_detect",
    "spend_digest_message",
    "spend_digest_send",
]
