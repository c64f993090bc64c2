"""Budget alert delivery: email through Django's backend, a signed webhook to a real HTTP server, once each."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import time_machine
from django.utils import timezone

from billing.alerts import (
    SIGNATURE_TOLERANCE_S,
    AlertDeliveryError,
    budget_alert_deliver,
    webhook_signature_verify,
)
from billing.budgets import budget_save
from billing.models import Budget, BudgetAlert, Unit
from billing.services import usage_record
from billing.tasks import budget_alert_deliver_task
from registry.models import Cluster
from stack.celery import app as celery_app
from tests.factories import make_cluster

pytestmark = pytest.mark.django_db

SECRET = "whsec-test-key"


@pytest.fixture(autouse=True)
def _loopback_allowed(settings: Any) -> None:
    """The receivers here run on loopback, which an admin allows for webhooks in settings."""
    settings.OUTBOUND_ALLOW_NETWORKS = ["127.0.0.1/32"]


@dataclass
class Receiver:
    """A webhook endpoint on loopback that records what it gets and answers `status`."""

    url: str = ""
    status: int = 200
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.received.append((dict(self.headers), body))
            self.send_response(state.status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_port}/hooks/budget"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # nothing listens there once closed


def _alert(cluster: Cluster, *, webhook_url: str = "", email_to: str = "ops@example.com") -> BudgetAlert:
    budget_save(
        budget=Budget(
            name="gpu-cap",
            scope=Budget.Scope.CLUSTER,
            cluster=cluster,
            limit_amount=Decimal("2.20"),
            thresholds=[100],
            hard_limit=True,
            email_to=email_to,
            webhook_url=webhook_url,
        ),
        webhook_secret=SECRET if webhook_url else None,
    )
    usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal("2"),
        occurred_at=timezone.now(),
        idempotency_key=f"alert-test:{cluster.slug}",
        subject_type="test",
        subject_id="1",
        cluster=cluster,
    )
    return BudgetAlert.objects.get()


@pytest.fixture
def cluster() -> Cluster:
    return make_cluster(price=Decimal("1.10"))


def test_an_alert_is_emailed_and_posted_signed_with_the_budget_secret_and_a_rerun_sends_nothing(
    cluster: Cluster, receiver: Receiver, mailoutbox: list[Any]
) -> None:
    alert = _alert(cluster, webhook_url=receiver.url, email_to="ops@example.com, finance@example.com")
    budget_alert_deliver_task.apply(args=[alert.pk]).get()

    assert len(mailoutbox) == 1
    mail = mailoutbox[0]
    assert mail.to == ["ops@example.com", "finance@example.com"]
    assert mail.subject == "[Switchyard] budget gpu-cap reached 100%"
    assert "2.2" in mail.body and "hard limit" in mail.body

    assert len(receiver.received) == 1
    headers, body = receiver.received[0]
    # The signature covers the timestamp: `<X-Switchyard-Timestamp>.<body>`.
    timestamp = headers["X-Switchyard-Timestamp"]
    assert abs(int(timestamp) - timezone.now().timestamp()) < SIGNATURE_TOLERANCE_S
    signed = timestamp.encode() + b"." + body
    expected = "sha256=" + hmac.new(SECRET.encode(), signed, hashlib.sha256).hexdigest()
    assert headers["X-Switchyard-Signature"] == expected
    assert headers["Content-Type"] == "application/json"
    payload = json.loads(body)
    assert payload["budget"] == "gpu-cap" and payload["threshold_percent"] == 100
    assert Decimal(payload["spent"]) == Decimal("2.2") and payload["currency"] == "USD"

    alert.refresh_from_db()
    assert alert.email_sent_at is not None and alert.webhook_sent_at is not None
    assert alert.webhook_status == "HTTP 200"

    budget_alert_deliver_task.apply(args=[alert.pk]).get()
    assert (len(mailoutbox), len(receiver.received)) == (1, 1)


def test_a_webhook_answering_503_is_retried_with_a_cap_and_the_email_goes_once(
    cluster: Cluster, receiver: Receiver, mailoutbox: list[Any]
) -> None:
    alert = _alert(cluster, webhook_url=receiver.url)
    receiver.status = 503
    with pytest.raises(AlertDeliveryError, match="HTTP 503"):
        budget_alert_deliver(alert_id=alert.pk)
    alert.refresh_from_db()
    assert (alert.webhook_sent_at, alert.webhook_status) == (None, "webhook: HTTP 503")
    assert alert.email_sent_at is not None and len(mailoutbox) == 1

    # The task retries this named error only, with backoff, at most max_retries
    # times (run eagerly here, so the backoff waits are skipped; eager retries
    # re-apply with the app's propagate setting, so switch it off meanwhile).
    propagates = celery_app.conf.task_eager_propagates
    celery_app.conf.task_eager_propagates = False
    try:
        result = budget_alert_deliver_task.apply(args=[alert.pk])
    finally:
        celery_app.conf.task_eager_propagates = propagates
    assert isinstance(result.result, AlertDeliveryError)
    assert len(receiver.received) == 1 + 1 + budget_alert_deliver_task.max_retries
    assert budget_alert_deliver_task.retry_backoff and budget_alert_deliver_task.retry_backoff_max == 600

    receiver.status = 204
    budget_alert_deliver(alert_id=alert.pk)
    alert.refresh_from_db()
    assert alert.webhook_sent_at is not None and alert.webhook_status == "HTTP 204"
    assert len(mailoutbox) == 1


def test_a_webhook_that_refuses_with_a_4xx_is_recorded_and_not_sent_again(
    cluster: Cluster, receiver: Receiver
) -> None:
    alert = _alert(cluster, webhook_url=receiver.url, email_to="")
    receiver.status = 410
    budget_alert_deliver(alert_id=alert.pk)  # no exception: nothing to retry
    alert.refresh_from_db()
    assert (alert.webhook_sent_at, alert.webhook_status) == (None, "HTTP 410 (refused; not retried)")
    assert len(receiver.received) == 1
    budget_alert_deliver(alert_id=alert.pk)  # refused for good, as a channel's: not sent again
    assert len(receiver.received) == 1


def test_an_unreachable_mail_server_is_transient_and_the_webhook_still_goes_out(
    cluster: Cluster, receiver: Receiver, settings: Any
) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", _closed_port(), 2
    alert = _alert(cluster, webhook_url=receiver.url)
    with pytest.raises(AlertDeliveryError, match="email: ConnectionRefusedError"):
        budget_alert_deliver(alert_id=alert.pk)
    alert.refresh_from_db()
    assert alert.email_sent_at is None and alert.webhook_sent_at is not None


def test_an_unreachable_webhook_is_a_transient_error(cluster: Cluster) -> None:
    alert = _alert(cluster, webhook_url=f"http://127.0.0.1:{_closed_port()}/hook", email_to="")
    with pytest.raises(AlertDeliveryError, match="ConnectionRefusedError"):
        budget_alert_deliver(alert_id=alert.pk)
    alert.refresh_from_db()
    assert alert.webhook_status == "webhook: ConnectionRefusedError"


def test_delivering_an_alert_that_is_gone_is_a_no_op(mailoutbox: list[Any]) -> None:
    budget_alert_deliver_task.apply(args=[987654]).get()
    assert mailoutbox == []


def test_a_webhooks_signature_breaks_when_its_timestamp_changes_or_is_too_old(
    cluster: Cluster, receiver: Receiver
) -> None:
    alert = _alert(cluster, webhook_url=receiver.url)
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        budget_alert_deliver_task.apply(args=[alert.pk]).get()
    headers, body = receiver.received[0]
    timestamp, signature = headers["X-Switchyard-Timestamp"], headers["X-Switchyard-Signature"]
    assert int(timestamp) == int(start.timestamp())

    def verify(**changed: Any) -> bool:
        given = {"secret": SECRET, "body": body, "timestamp": timestamp, "signature": signature, **changed}
        return webhook_signature_verify(**given)

    with time_machine.travel(start + timedelta(seconds=60), tick=False):
        assert verify()
        # A replay that claims a fresh timestamp no longer matches the signature.
        assert not verify(timestamp=str(int(timestamp) + 60))
        assert not verify(body=body + b" ")
        assert not verify(secret="another secret")
    with time_machine.travel(start + timedelta(seconds=SIGNATURE_TOLERANCE_S + 1), tick=False):
        assert not verify()  # the captured request, replayed after the tolerance
