"""Alert channels: Slack, Teams and signed webhooks delivered to a real HTTP server on loopback,
URLs checked where they enter, and one incident raising one alert per quiet period."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from billing.alerts import (
    AlertChannelInvalid,
    AlertDeliveryError,
    AlertMessage,
    alert_channel_save,
    alert_delivery_send,
    alert_raise,
    webhook_signature_verify,
)
from billing.alerts.formats import slack_body, teams_body
from billing.budgets import budget_save
from billing.models import AlertChannel, AlertDelivery, AlertKind, Budget, Unit
from billing.services import usage_record
from registry.outbound import guard as outbound
from tests.capture_server import CaptureServer
from tests.factories import make_cluster

pytestmark = pytest.mark.django_db
MESSAGE = AlertMessage(
    title="Budget chat reached 80%",
    text="Workflow chat has spent <80> of 100 USD & more",
    facts=[("Spent", "80 USD"), ("Limit", "100 USD")],
    path="/billing/budgets/",
)


@pytest.fixture(autouse=True)
def _loopback_allowed(settings: Any) -> Iterator[None]:
    """The receivers run on loopback, which an admin allows for webhooks in settings."""
    settings.OUTBOUND_ALLOW_NETWORKS = ["127.0.0.1/32"]
    settings.SWITCHYARD_PUBLIC_URL = "https://switchyard.example.com"
    outbound.decisions_clear()
    yield
    outbound.decisions_clear()


@pytest.fixture
def receiver() -> Iterator[CaptureServer]:
    server = CaptureServer().start()
    yield server
    server.stop()


def _channel(kind: str, url: str, **fields: Any) -> AlertChannel:
    secret = "whsec" if kind == AlertChannel.Kind.WEBHOOK else None
    return alert_channel_save(
        channel=AlertChannel(name=f"{kind}-ops", kind=kind, **fields), url=url, secret=secret
    )


def _raise_and_send(**kwargs: Any) -> list[AlertDelivery]:
    created = alert_raise(kind=AlertKind.BUDGET, message=MESSAGE, now=timezone.now(), **kwargs)
    for delivery in created:
        alert_delivery_send(delivery_id=delivery.pk)
    return created


def test_a_slack_channel_gets_an_incoming_webhook_message_with_blocks(receiver: CaptureServer) -> None:
    _channel(AlertChannel.Kind.SLACK, f"{receiver.url}/services/T0/B0/secret")
    (delivery,) = _raise_and_send(dedup_key="budget:1")
    (seen,) = receiver.seen
    body = json.loads(seen.body)
    assert seen.path == "/services/T0/B0/secret" and seen.headers["Content-Type"] == "application/json"
    assert body["text"] == MESSAGE.title
    kinds = [b["type"] for b in body["blocks"]]
    assert kinds == ["header", "section", "section", "context"]
    assert body["blocks"][0]["text"] == {"type": "plain_text", "text": MESSAGE.title, "emoji": False}
    # mrkdwn's control characters are escaped; the facts are fields; the link is absolute.
    assert body["blocks"][1]["text"]["text"] == "Workflow chat has spent &lt;80&gt; of 100 USD &amp; more"
    assert body["blocks"][2]["fields"][0] == {"type": "mrkdwn", "text": "*Spent*\n80 USD"}
    assert "https://switchyard.example.com/billing/budgets/" in body["blocks"][3]["elements"][0]["text"]
    delivery.refresh_from_db()
    assert delivery.sent_at is not None and delivery.status == "HTTP 200"
    assert "X-Switchyard-Signature" not in seen.headers


def test_a_teams_channel_gets_a_message_with_an_adaptive_card(receiver: CaptureServer) -> None:
    _channel(AlertChannel.Kind.TEAMS, f"{receiver.url}/webhookb2/x")
    _raise_and_send(dedup_key="budget:1")
    body = json.loads(receiver.seen[0].body)
    assert body["type"] == "message"
    (attachment,) = body["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = attachment["content"]
    assert (card["type"], card["version"]) == ("AdaptiveCard", "1.4")
    assert card["body"][0]["text"] == MESSAGE.title
    assert card["body"][2] == {
        "type": "FactSet",
        "facts": [{"title": "Spent", "value": "80 USD"}, {"title": "Limit", "value": "100 USD"}],
    }
    assert card["actions"][0]["url"] == "https://switchyard.example.com/billing/budgets/"


def test_a_generic_webhook_is_signed_with_the_channels_secret(receiver: CaptureServer) -> None:
    _channel(AlertChannel.Kind.WEBHOOK, f"{receiver.url}/hook")
    (delivery,) = _raise_and_send(dedup_key="budget:1")
    (seen,) = receiver.seen
    timestamp = seen.headers["X-Switchyard-Timestamp"]
    signed = timestamp.encode() + b"." + seen.body  # the signature covers the timestamp
    expected = "sha256=" + hmac.new(b"whsec", signed, hashlib.sha256).hexdigest()
    assert seen.headers["X-Switchyard-Signature"] == expected
    signature = seen.headers["X-Switchyard-Signature"]
    assert webhook_signature_verify(secret="whsec", body=seen.body, timestamp=timestamp, signature=signature)
    later = str(int(timestamp) + 1)
    assert not webhook_signature_verify(secret="whsec", body=seen.body, timestamp=later, signature=signature)
    body = json.loads(seen.body)
    assert (body["delivery_id"], body["kind"], body["dedup_key"]) == (delivery.pk, "budget", "budget:1")
    assert body["facts"] == {"Spent": "80 USD", "Limit": "100 USD"}


def test_a_delivery_is_sent_once_and_a_5xx_is_retried_until_it_answers(receiver: CaptureServer) -> None:
    _channel(AlertChannel.Kind.SLACK, f"{receiver.url}/s")
    receiver.status = 503
    (delivery,) = alert_raise(kind=AlertKind.BUDGET, dedup_key="k", message=MESSAGE, now=timezone.now())
    with pytest.raises(AlertDeliveryError):
        alert_delivery_send(delivery_id=delivery.pk)
    receiver.status = 200
    alert_delivery_send(delivery_id=delivery.pk)
    alert_delivery_send(delivery_id=delivery.pk)  # already sent: nothing goes out
    assert len(receiver.seen) == 2
    delivery.refresh_from_db()
    assert delivery.status == "HTTP 200"


def test_a_repeat_within_the_quiet_period_is_counted_not_sent_and_after_it_alerts_again(
    receiver: CaptureServer, django_capture_on_commit_callbacks: Any
) -> None:
    channel = _channel(AlertChannel.Kind.SLACK, f"{receiver.url}/s", quiet_period_seconds=600)
    now = timezone.now()
    with django_capture_on_commit_callbacks() as sends:
        first = alert_raise(kind=AlertKind.BUDGET, dedup_key="budget:7", message=MESSAGE, now=now)
        again = alert_raise(
            kind=AlertKind.BUDGET, dedup_key="budget:7", message=MESSAGE, now=now + timedelta(seconds=300)
        )
        other = alert_raise(kind=AlertKind.BUDGET, dedup_key="budget:8", message=MESSAGE, now=now)
    assert (len(first), again, len(other)) == (1, [], 1)
    assert len(sends) == 2  # one send enqueued per delivery, after commit
    first[0].refresh_from_db()
    assert first[0].repeats == 1
    later = alert_raise(
        kind=AlertKind.BUDGET, dedup_key="budget:7", message=MESSAGE, now=now + timedelta(seconds=601)
    )
    assert len(later) == 1
    assert AlertDelivery.objects.filter(channel=channel, dedup_key="budget:7").count() == 2


def test_a_refused_delivery_is_final_and_an_internal_name_never_reached(
    receiver: CaptureServer, settings: Any
) -> None:
    _channel(AlertChannel.Kind.SLACK, f"{receiver.url}/s")
    receiver.status = 404
    (gone,) = alert_raise(kind=AlertKind.BUDGET, dedup_key="a", message=MESSAGE, now=timezone.now())
    alert_delivery_send(delivery_id=gone.pk)
    alert_delivery_send(delivery_id=gone.pk)  # refused for good: not sent again
    assert len(receiver.seen) == 1
    gone.refresh_from_db()
    assert gone.sent_at is None and gone.status == "HTTP 404 (refused; not retried)"
    # A host name that resolves to loopback passes the entry check (names are checked on use)
    # and is refused by the outbound guard when sent, once the admin's allowance is gone.
    AlertChannel.objects.all().delete()
    _channel(AlertChannel.Kind.WEBHOOK, f"http://localhost:{receiver.port}/hook")
    settings.OUTBOUND_ALLOW_NETWORKS = []
    outbound.decisions_clear()
    (refused,) = alert_raise(kind=AlertKind.BUDGET, dedup_key="b", message=MESSAGE, now=timezone.now())
    alert_delivery_send(delivery_id=refused.pk)
    refused.refresh_from_db()
    assert refused.status == "refused by the outbound policy (not retried)" and len(receiver.seen) == 1


def test_a_channel_gets_only_the_kinds_it_subscribed_to(receiver: CaptureServer) -> None:
    _channel(AlertChannel.Kind.SLACK, f"{receiver.url}/s", budget_alerts=False)
    assert alert_raise(kind=AlertKind.BUDGET, dedup_key="k", message=MESSAGE, now=timezone.now()) == []
    assert len(alert_raise(kind=AlertKind.ANOMALY, dedup_key="k", message=MESSAGE, now=timezone.now())) == 1


def test_every_threshold_crossed_alerts_at_once_even_when_one_write_crosses_several(
    receiver: CaptureServer,
) -> None:
    _channel(AlertChannel.Kind.SLACK, f"{receiver.url}/s")
    cluster = make_cluster(price=Decimal("1.000000"))
    budget_save(
        budget=Budget(
            name="gpu-cap", scope=Budget.Scope.CLUSTER, cluster=cluster, limit_amount=Decimal("10"),
            thresholds=[50, 80, 100],
        )
    )  # fmt: skip
    for i, hours in enumerate(("6", "5", "1")):  # 60%, then 110% (past 80 and 100 at once), then 120%
        usage_record(
            unit=Unit.ACCELERATOR_HOUR, quantity=Decimal(hours), occurred_at=timezone.now(),
            idempotency_key=f"incident:{i}", subject_type="test", subject_id="1", cluster=cluster,
        )  # fmt: skip
    budget = Budget.objects.get(name="gpu-cap")
    assert budget.alerts.count() == 3  # the budget's own record keeps every threshold
    deliveries = AlertDelivery.objects.order_by("pk")
    # One delivery per threshold, none folded into another's quiet period; the third write
    # crossed nothing new and sent nothing.
    assert [d.message["title"] for d in deliveries] == [
        f"Budget gpu-cap reached {percent}%" for percent in (50, 80, 100)
    ]
    assert all(d.kind == "budget" and d.repeats == 0 for d in deliveries)


@pytest.mark.parametrize(
    ("kind", "url", "problem"),
    [
        ("slack", "http://hooks.slack.com/services/x", "https://"),
        ("slack", "http://127.0.0.1:8080/services/x", "https://"),
        ("teams", "ftp://example.com/x", "https://"),
        ("webhook", "http://10.0.0.5/hook", "outbound policy"),
        ("webhook", "http://169.254.169.254/latest/", "outbound policy"),
        ("webhook", "https://user:pw@hooks.example.com/x", "user name or password"),
        ("slack", "https://hooks.slack.com/services/x y", "spaces"),
    ],
)
def test_a_channel_url_is_refused_where_it_enters(kind: str, url: str, problem: str, settings: Any) -> None:
    settings.OUTBOUND_ALLOW_NETWORKS = []
    with pytest.raises(AlertChannelInvalid) as raised:
        alert_channel_save(channel=AlertChannel(name="bad", kind=kind), url=url, secret="s")
    assert problem in " ".join(raised.value.errors["url"])
    assert not AlertChannel.objects.exists()


def test_a_signed_webhook_needs_a_secret() -> None:
    with pytest.raises(AlertChannelInvalid) as raised:
        alert_channel_save(
            channel=AlertChannel(name="w", kind="webhook"), url="https://h.example.com/x", secret=None
        )
    assert "secret" in raised.value.errors


def test_the_channel_page_shows_form_errors_and_never_shows_the_url_again(operator: User) -> None:
    client = Client()
    client.force_login(operator)
    bad = client.post(
        "/billing/alert-channels/new/",
        {"name": "ops", "kind": "slack", "url": "http://hooks.slack.com/x", "quiet_period_seconds": 3600},
    )
    assert bad.status_code == 400 and "url" in bad.context["form"].errors
    secret_url = "https://hooks.slack.com/services/T000/B000/XXXXsecret"
    ok = client.post(
        "/billing/alert-channels/new/",
        {"name": "ops", "kind": "slack", "url": secret_url, "quiet_period_seconds": 3600, "budget_alerts": "on",
         "active": "on"},
    )  # fmt: skip
    assert ok.status_code == 302
    channel = AlertChannel.objects.get(name="ops")
    assert channel.url_host == "hooks.slack.com" and "XXXXsecret" not in channel.url_encrypted
    for page in ("/billing/alert-channels/", f"/billing/alert-channels/{channel.pk}/edit/"):
        response = client.get(page)
        assert response.status_code == 200 and b"XXXXsecret" not in response.content
    # Saving without a URL keeps the stored one.
    kept = client.post(
        f"/billing/alert-channels/{channel.pk}/edit/",
        {"name": "ops", "kind": "slack", "quiet_period_seconds": 60, "active": "on"},
    )
    assert kept.status_code == 302
    channel.refresh_from_db()
    assert channel.quiet_period_seconds == 60 and channel.url_host == "hooks.slack.com"


def test_slack_and_teams_shapes_leave_out_what_the_message_lacks() -> None:
    bare = {"title": "t", "text": "", "facts": [], "link": ""}
    assert slack_body(message=bare)["blocks"] == [
        {"type": "header", "text": {"type": "plain_text", "text": "t", "emoji": False}}
    ]
    assert "actions" not in teams_body(message=bare)["attachments"][0]["content"]
