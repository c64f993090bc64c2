"""The spend anomaly detector reads the daily rollups of the ledger: a normal week raises
nothing, a spike raises one anomaly (and one alert) per target however often it runs, and its
page shows why it fired. Also the daily spend digest per team."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from billing.alerts import alert_channel_save, alert_delivery_send, anomaly_verdict, spend_anomalies_detect
from billing.alerts.digest import spend_digest_send
from billing.models import AlertChannel, AlertDelivery, SpendAnomaly, Unit
from billing.rollups import rollups_update
from billing.services import UsageInput, usage_record_batch
from registry.models import Cluster
from registry.outbound import guard as outbound
from tests.capture_server import CaptureServer
from tests.factories import make_cluster, make_price

pytestmark = pytest.mark.django_db
TODAY = datetime(2026, 6, 30, tzinfo=UTC)
HISTORY_DAYS = 35


@pytest.fixture(autouse=True)
def _loopback_allowed(settings: Any) -> Iterator[None]:
    settings.OUTBOUND_ALLOW_NETWORKS = ["127.0.0.1/32"]
    settings.ANOMALY_MIN_AMOUNT = Decimal("1.00")
    outbound.decisions_clear()
    yield
    outbound.decisions_clear()


@pytest.fixture
def receiver() -> Iterator[CaptureServer]:
    server = CaptureServer().start()
    yield server
    server.stop()


@pytest.fixture
def cluster() -> Cluster:
    cluster = make_cluster(price=None)
    make_price(cluster=cluster, unit_price=Decimal("1.000000"), effective_from=TODAY - timedelta(days=90))
    return cluster


def _bill(cluster: Cluster, hours: Decimal, at: datetime, key: str, team: str = "") -> None:
    usage_record_batch(
        items=[
            UsageInput(
                unit=Unit.ACCELERATOR_HOUR, quantity=hours, occurred_at=at, idempotency_key=key,
                subject_type="test", subject_id="1", cluster=cluster, team=team,
            )
        ]
    )  # fmt: skip


def _normal_history(cluster: Cluster) -> None:
    """Five weeks of ordinary days: 10 to 14 accelerator-hours a day at $1 (median 12, MAD 1)."""
    for back in range(1, HISTORY_DAYS + 1):
        day = TODAY - timedelta(days=back)
        _bill(cluster, Decimal(10 + back % 5), day + timedelta(hours=3), f"hist:{back}")


def test_the_verdict_is_the_modified_z_score_over_the_median_and_mad() -> None:
    baseline = [Decimal(v) for v in (10, 11, 12, 13, 14, 12, 12)]
    verdict = anomaly_verdict(spent_so_far=Decimal(20), elapsed_fraction=Decimal("0.5"), baseline=baseline)
    assert (verdict.rate, verdict.median, verdict.mad) == (Decimal(40), Decimal(12), Decimal(1))
    assert verdict.threshold == Decimal(12) + Decimal("3.5") * Decimal("1.4826")
    assert verdict.fires
    # A flat history (MAD 0) is not an excuse to call every cent above it an anomaly.
    flat = anomaly_verdict(
        spent_so_far=Decimal("10.5"), elapsed_fraction=Decimal(1), baseline=[Decimal(10)] * 7
    )
    assert flat.mad == 0 and flat.threshold == Decimal("13.5") and not flat.fires


def test_a_normal_week_raises_nothing(cluster: Cluster, receiver: CaptureServer) -> None:
    alert_channel_save(channel=AlertChannel(name="slack", kind="slack"), url=f"{receiver.url}/s", secret=None)
    _normal_history(cluster)
    rollups_update()
    for back in range(7, 0, -1):  # each of the last seven days, judged at its end
        assert (
            spend_anomalies_detect(now=TODAY - timedelta(days=back) + timedelta(hours=23, minutes=59)) == []
        )
    assert not SpendAnomaly.objects.exists() and not AlertDelivery.objects.exists()


def test_a_spike_raises_one_anomaly_and_one_alert_per_target_however_often_it_runs(
    cluster: Cluster, receiver: CaptureServer, auditor: User
) -> None:
    alert_channel_save(channel=AlertChannel(name="slack", kind="slack"), url=f"{receiver.url}/s", secret=None)
    _normal_history(cluster)
    _bill(cluster, Decimal(20), TODAY + timedelta(hours=9), "spike")  # $20 by noon: $40 a day
    rollups_update()
    found = spend_anomalies_detect(now=TODAY + timedelta(hours=12))
    for minutes in (15, 30, 90):  # beat runs it again
        assert spend_anomalies_detect(now=TODAY + timedelta(hours=12, minutes=minutes)) == []
    # The cluster's spend is also its provider's: each target fired once.
    assert sorted((a.dimension, a.target_id) for a in found) == [
        ("cluster", cluster.pk),
        ("provider", cluster.provider_id),
    ]
    assert SpendAnomaly.objects.count() == 2
    anomaly = SpendAnomaly.objects.get(dimension="cluster")
    assert (anomaly.spent_so_far, anomaly.rate, anomaly.median, anomaly.mad) == (
        Decimal(20), Decimal(40), Decimal(12), Decimal(1)
    )  # fmt: skip
    assert anomaly.threshold == Decimal("17.189100000") and len(anomaly.baseline) == 28
    deliveries = list(AlertDelivery.objects.order_by("id"))
    assert [(d.kind, d.dedup_key) for d in deliveries] == [
        ("anomaly", f"anomaly:{a.dimension}:{a.target_id}:USD") for a in sorted(found, key=lambda a: a.pk)
    ]
    for d in deliveries:
        alert_delivery_send(delivery_id=d.pk)
    bodies = [json.loads(s.body) for s in receiver.seen]
    assert len(bodies) == 2 and bodies[0]["text"].startswith("Spend anomaly: ")
    # The page shows why it fired: today's rate, the median, the MAD, the threshold, the baseline.
    client = Client()
    client.force_login(auditor)
    page = client.get(f"/billing/anomalies/{anomaly.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    for figure in ("40.00 USD/day", "12.00 USD/day", "1.00 USD", "17.1891 USD/day", "2026-06-29"):
        assert figure in html
    assert client.get("/billing/anomalies/").status_code == 200


def test_a_target_with_too_little_history_is_not_judged(cluster: Cluster) -> None:
    for back in range(1, 4):
        _bill(cluster, Decimal(1), TODAY - timedelta(days=back, hours=-3), f"short:{back}")
    _bill(cluster, Decimal(50), TODAY + timedelta(hours=1), "new-spike")
    rollups_update()
    assert spend_anomalies_detect(now=TODAY + timedelta(hours=12)) == []


def test_the_daily_digest_goes_once_per_team_and_day_to_the_channels_that_take_it(
    cluster: Cluster, receiver: CaptureServer
) -> None:
    everyone = alert_channel_save(
        channel=AlertChannel(name="all", kind="slack", daily_digest=True),
        url=f"{receiver.url}/all",
        secret=None,
    )
    ml_only = alert_channel_save(
        channel=AlertChannel(name="ml", kind="teams", daily_digest=True, digest_team="ml"),
        url=f"{receiver.url}/ml",
        secret=None,
    )
    yesterday = TODAY - timedelta(days=1)
    _bill(cluster, Decimal(3), yesterday - timedelta(hours=5), "ml-before", team="ml")
    _bill(cluster, Decimal(5), yesterday + timedelta(hours=2), "ml-1", team="ml")
    _bill(cluster, Decimal(2), yesterday + timedelta(hours=4), "search-1", team="search")
    rollups_update()
    created = spend_digest_send(now=TODAY + timedelta(minutes=15))
    assert spend_digest_send(now=TODAY + timedelta(hours=5)) == []  # a second run sends nothing
    sent = sorted((d.channel.name, d.dedup_key) for d in created)
    assert sent == [("all", "digest:ml:2026-06-29"), ("all", "digest:search:2026-06-29"),
                    ("ml", "digest:ml:2026-06-29")]  # fmt: skip
    ml = AlertDelivery.objects.get(channel=ml_only)
    facts = dict(ml.message["facts"])
    assert facts["Total USD"] == "5.00 USD (+2.00 USD on the day before)"
    assert facts["Top providers"] == f"{cluster.provider.slug} 5.00 USD"
    for d in created:
        alert_delivery_send(delivery_id=d.pk)
    assert sorted(s.path for s in receiver.seen) == ["/all", "/all", "/ml"]
    assert everyone.deliveries.count() == 2


def test_the_detector_and_the_digest_are_declared_on_the_control_queue(settings: Any) -> None:
    from billing.tasks import spend_anomalies_detect_task, spend_digest_send_task

    entries = {e["task"]: e for e in settings.CELERY_BEAT_SCHEDULE.values()}
    for name in ("billing.spend_anomalies_detect", "billing.spend_digest_send"):
        assert entries[name]["options"]["queue"] == "control"
    assert spend_anomalies_detect_task.name == "billing.spend_anomalies_detect"
    assert spend_digest_send_task() == 0  # nothing spent yesterday: no digest
