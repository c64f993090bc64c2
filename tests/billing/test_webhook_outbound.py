"""Budget webhooks pass the outbound guard: no loopback, private, link-local or metadata address
unless an admin listed its network (SWITCHYARD_OUTBOUND_ALLOW_NETWORKS), and no redirects."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from billing.alerts import budget_alert_deliver
from billing.budgets import budget_save
from billing.models import Budget, BudgetAlert, Unit
from billing.services import usage_record
from registry.models import Cluster
from registry.outbound import guard as outbound
from tests.capture_server import CaptureServer
from tests.factories import api_client, make_cluster

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_decisions() -> Iterator[None]:
    outbound.decisions_clear()
    yield
    outbound.decisions_clear()


@pytest.fixture
def internal() -> Iterator[CaptureServer]:
    server = CaptureServer().start()
    yield server
    server.stop()


@pytest.fixture
def cluster(db: Any) -> Cluster:
    return make_cluster(price=Decimal("1.100000"))


def _alert(cluster: Cluster, webhook_url: str) -> BudgetAlert:
    budget_save(
        budget=Budget(
            name="cap",
            scope=Budget.Scope.CLUSTER,
            cluster=cluster,
            limit_amount=Decimal("1.00"),
            thresholds=[100],
            webhook_url=webhook_url,
        ),
        webhook_secret="whsec",
    )
    usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal("2"),
        occurred_at=timezone.now(),
        idempotency_key=f"webhook-ssrf:{cluster.slug}",
        subject_type="test",
        subject_id="1",
        cluster=cluster,
    )
    return BudgetAlert.objects.get()


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/admin/",
        "http://169.254.169.254/latest/meta-data/iam/",
        "http://10.0.0.5/hook",
        "http://[::1]:6379/",
        "http://[::ffff:127.0.0.1]/",
        "http://user:pw@hooks.example.com/x",
    ],
)
def test_a_webhook_aimed_at_an_internal_address_is_refused_when_saved(
    operator: User, cluster: Cluster, url: str
) -> None:
    response = api_client(operator).post(
        "/api/budgets/",
        {
            "name": "b",
            "scope": "cluster",
            "cluster": cluster.slug,
            "limit_amount": "5.00",
            "thresholds": [100],
            "webhook_url": url,
            "webhook_secret": "whsec",
        },
        format="json",
    )
    assert response.status_code == 400, response.content
    assert "webhook_url" in response.json()
    assert not Budget.objects.filter(name="b").exists()


def test_a_webhook_name_that_resolves_to_loopback_is_refused_when_sent(
    cluster: Cluster, internal: CaptureServer
) -> None:
    alert = _alert(cluster, f"http://localhost:{internal.port}/hook")
    budget_alert_deliver(alert_id=alert.pk)  # refused is final: nothing to retry
    alert.refresh_from_db()
    assert internal.seen == []
    assert alert.webhook_sent_at is None
    assert alert.webhook_status == "refused by the outbound policy (not retried)"


def test_an_admin_listed_network_lets_the_webhook_through_and_a_redirect_is_not_followed(
    cluster: Cluster, internal: CaptureServer, settings: Any
) -> None:
    settings.OUTBOUND_ALLOW_NETWORKS = ["127.0.0.1/32"]
    target = CaptureServer(host="127.0.0.2").start()
    try:
        internal.status = 307
        internal.headers = {"Location": f"{target.url}/elsewhere"}
        alert = _alert(cluster, f"{internal.url}/hook")
        budget_alert_deliver(alert_id=alert.pk)
        alert.refresh_from_db()
        assert len(internal.seen) == 1 and internal.seen[0].headers["X-Switchyard-Signature"].startswith(
            "sha256="
        )
        assert target.seen == []
        assert alert.webhook_status == "HTTP 307 (refused; not retried)"
    finally:
        target.stop()
