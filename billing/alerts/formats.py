"""How one alert message looks on each channel kind: the signed generic JSON, a Slack incoming
webhook with Block Kit blocks, and a Microsoft Teams message carrying an Adaptive Card; and how
a budget alert looks in the budget's own webhook and email.

A message is plain data: {"title", "text", "facts": [[label, value], ...], "link"}. Nothing here
touches the network or queries the database, so each shape is tested on its own.
"""

from __future__ import annotations

from typing import Any

from billing.models import BudgetAlert

# Block Kit limits (api.slack.com/reference/block-kit/blocks): a header's text is at most 150
# characters, a section's text 3000, a section holds at most 10 fields of 2000 each.
SLACK_HEADER_MAX = 150
SLACK_TEXT_MAX = 3000
SLACK_FIELDS_MAX = 10
SLACK_FIELD_MAX = 2000


def _slack_escape(text: str) -> str:
    # mrkdwn treats &, < and > as control characters (api.slack.com "Escaping text").
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def generic_body(
    *, message: dict[str, Any], kind: str, dedup_key: str, delivery_id: int, at: str
) -> dict[str, Any]:
    """The signed webhook's JSON: the message plus what a receiver needs to deduplicate."""
    return {
        "delivery_id": delivery_id,
        "kind": kind,
        "dedup_key": dedup_key,
        "created_at": at,
        "title": message.get("title", ""),
        "text": message.get("text", ""),
        "facts": {label: value for label, value in message.get("facts", [])},
        "link": message.get("link", ""),
    }


def slack_body(*, message: dict[str, Any]) -> dict[str, Any]:
    """A Slack incoming-webhook payload: `text` (the notification's fallback) and blocks."""
    title = str(message.get("title", ""))
    text = str(message.get("text", ""))
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:SLACK_HEADER_MAX], "emoji": False}}
    ]
    if text:
        blocks.append(
            {"type": "section", "text": {"type": "mrkdwn", "text": _slack_escape(text)[:SLACK_TEXT_MAX]}}
        )
    facts = message.get("facts", [])
    if facts:
        fields = [
            {
                "type": "mrkdwn",
                "text": f"*{_slack_escape(str(label))}*\n{_slack_escape(str(value))}"[:SLACK_FIELD_MAX],
            }
            for label, value in facts[:SLACK_FIELDS_MAX]
        ]
        blocks.append({"type": "section", "fields": fields})
    link = message.get("link")
    if link:
        blocks.append(
            {"type": "context", "elements": [{"type": "mrkdwn", "text": f"<{link}|Open in Switchyard>"}]}
        )
    return {"text": title, "blocks": blocks}


def teams_body(*, message: dict[str, Any]) -> dict[str, Any]:
    """A Teams webhook message with one Adaptive Card attachment (schema 1.4, which Teams renders;
    learn.microsoft.com "Create and send messages" for incoming webhooks and Workflows)."""
    body: list[dict[str, Any]] = [
        {
            "type": "TextBlock",
            "text": str(message.get("title", "")),
            "weight": "Bolder",
            "size": "Medium",
            "wrap": True,
        }
    ]
    if message.get("text"):
        body.append({"type": "TextBlock", "text": str(message["text"]), "wrap": True})
    facts = message.get("facts", [])
    if facts:
        body.append({"type": "FactSet", "facts": [{"title": str(k), "value": str(v)} for k, v in facts]})
    card: dict[str, Any] = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": body,
    }
    if message.get("link"):
        card["actions"] = [{"type": "Action.OpenUrl", "title": "Open in Switchyard", "url": message["link"]}]
    return {
        "type": "message",
        "attachments": [
            {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None, "content": card}
        ],
    }


def budget_alert_payload(*, alert: BudgetAlert) -> dict[str, Any]:
    """A budget's own webhook's JSON body for one of its alerts."""
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


def budget_alert_email(*, alert: BudgetAlert) -> tuple[str, str]:
    """The subject and text of a budget's own email for one of its alerts."""
    budget = alert.budget
    subject = f"[Switchyard] budget {budget.name} reached {alert.threshold_percent}%"
    body = (
        f"Budget {budget.name!r} ({budget.get_scope_display()}) has spent {alert.spent} of its "
        f"{alert.limit_amount} {budget.currency} limit for the period starting "
        f"{alert.period_start:%Y-%m-%d %H:%M} UTC ({alert.threshold_percent}% threshold).\n"
    )
    if budget.hard_limit and alert.threshold_percent >= 100:
        body += "It is a hard limit: new spending under it is refused until the next period.\n"
    return subject, body
