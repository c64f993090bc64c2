"""Cluster status derived from worker heartbeats, the failover events it records, and /healthz."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from registry import services
from registry.models import Cluster, FailoverEvent, WorkerHeartbeat
from registry.tasks import cluster_health_check as cluster_health_check_task
from tests.factories import api_client, make_cluster

pytestmark = pytest.mark.django_db

DEGRADED_AFTER = 10.0
DOWN_AFTER = 30.0


@pytest.fixture(autouse=True)
def _health_timings(settings: Any) -> None:
    settings.HEARTBEAT_SECONDS = 2.0
    settings.DEGRADED_AFTER_SECONDS = DEGRADED_AFTER
    settings.DOWN_AFTER_SECONDS = DOWN_AFTER


@pytest.fixture
def last_beat() -> datetime:
    # An hour ago, so that a real heartbeat now comes after every checked moment.
    return timezone.now() - timedelta(hours=1)


def _healthy_cluster(last_beat: datetime, **overrides: Any) -> Cluster:
    return make_cluster(
        status=Cluster.Status.HEALTHY, last_heartbeat_at=last_beat, status_changed_at=last_beat, **overrides
    )


def _after(moment: datetime, seconds: float) -> datetime:
    return moment + timedelta(seconds=seconds)


def _beat(cluster: Cluster, hostname: str = "w1@host") -> Cluster | None:
    return services.cluster_heartbeat(
        cluster_slug=cluster.slug, hostname=hostname, pid=4242, started_at=timezone.now()
    )


def test_a_cluster_that_heartbeats_recently_stays_healthy(last_beat: datetime) -> None:
    cluster = _healthy_cluster(last_beat)
    assert services.cluster_health_check(now=_after(last_beat, DEGRADED_AFTER - 1)) == []
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.HEALTHY
    assert not FailoverEvent.objects.exists()


def test_a_silent_cluster_turns_degraded_then_down_with_exactly_one_event(last_beat: datetime) -> None:
    cluster = _healthy_cluster(last_beat)

    degraded_at = _after(last_beat, DEGRADED_AFTER + 1)
    transitions = services.cluster_health_check(now=degraded_at)
    assert [(t.cluster_slug, t.old, t.new) for t in transitions] == [(cluster.slug, "healthy", "degraded")]
    cluster.refresh_from_db()
    assert (cluster.status, cluster.status_changed_at) == (Cluster.Status.DEGRADED, degraded_at)
    assert not FailoverEvent.objects.exists()  # degraded is a warning, not a failover

    down_at = _after(last_beat, DOWN_AFTER + 1)
    transitions = services.cluster_health_check(now=down_at)
    assert [(t.old, t.new) for t in transitions] == [("degraded", "down")]
    cluster.refresh_from_db()
    assert (cluster.status, cluster.status_changed_at) == (Cluster.Status.DOWN, down_at)

    event = FailoverEvent.objects.get()
    assert event.kind == FailoverEvent.Kind.CLUSTER_HEALTH and event.code == "heartbeat_timeout"
    assert event.from_cluster == cluster
    assert event.from_provider == cluster.provider
    assert event.to_cluster is None
    assert event.detected_at == down_at
    assert event.reason == f"degraded → down: no worker heartbeat for {DOWN_AFTER + 1:.0f}s"
    assert event.subject == f"cluster:{cluster.slug}"
    assert event.details["previous_status"] == "degraded"
    assert (event.recovered_at, event.time_lost) == (None, None)


def test_a_cluster_silent_past_the_down_limit_goes_straight_from_healthy_to_down(last_beat: datetime) -> None:
    _healthy_cluster(last_beat)
    transitions = services.cluster_health_check(now=_after(last_beat, DOWN_AFTER + 5))
    assert [(t.old, t.new) for t in transitions] == [("healthy", "down")]
    assert FailoverEvent.objects.get().reason.startswith("healthy → down")


def test_checking_a_down_cluster_again_records_no_second_event(last_beat: datetime) -> None:
    cluster = _healthy_cluster(last_beat)
    services.cluster_health_check(now=_after(last_beat, DOWN_AFTER + 1))
    assert services.cluster_health_check(now=_after(last_beat, DOWN_AFTER + 60)) == []
    assert FailoverEvent.objects.filter(from_cluster=cluster).count() == 1


def test_a_heartbeat_turns_a_down_cluster_healthy_and_closes_its_event(last_beat: datetime) -> None:
    cluster = _healthy_cluster(last_beat)
    down_at = _after(last_beat, DOWN_AFTER + 1)
    services.cluster_health_check(now=down_at)

    before = timezone.now()
    assert _beat(cluster) is not None
    after = timezone.now()

    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.HEALTHY
    assert before <= cluster.last_heartbeat_at <= after
    assert cluster.status_changed_at == cluster.last_heartbeat_at
    worker = WorkerHeartbeat.objects.get(cluster=cluster)
    assert (worker.hostname, worker.pid, worker.last_seen_at) == ("w1@host", 4242, cluster.last_heartbeat_at)

    event = FailoverEvent.objects.get()
    assert event.recovered_at == cluster.last_heartbeat_at
    assert event.time_lost == event.recovered_at - down_at
    assert event.time_lost > timedelta(0)


def test_a_heartbeat_turns_a_degraded_cluster_healthy_without_any_event(last_beat: datetime) -> None:
    cluster = _healthy_cluster(last_beat)
    services.cluster_health_check(now=_after(last_beat, DEGRADED_AFTER + 1))
    _beat(cluster)
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.HEALTHY
    assert not FailoverEvent.objects.exists()


def test_a_new_cluster_is_down_until_its_first_heartbeat_and_that_records_no_event() -> None:
    cluster = make_cluster()
    assert cluster.status == Cluster.Status.DOWN
    assert services.cluster_health_check() == []
    _beat(cluster)
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.HEALTHY
    assert not FailoverEvent.objects.exists()


def test_each_worker_of_a_cluster_keeps_its_own_heartbeat_row(last_beat: datetime) -> None:
    cluster = _healthy_cluster(last_beat)
    _beat(cluster, "w1@host")
    _beat(cluster, "w2@host")
    _beat(cluster, "w1@host")
    assert sorted(WorkerHeartbeat.objects.filter(cluster=cluster).values_list("hostname", flat=True)) == [
        "w1@host",
        "w2@host",
    ]


def test_a_heartbeat_for_an_unknown_cluster_is_ignored() -> None:
    result = services.cluster_heartbeat(cluster_slug="nope", hostname="h", pid=1, started_at=timezone.now())
    assert result is None
    assert not WorkerHeartbeat.objects.exists()


def test_draining_clusters_are_left_alone_by_the_check_and_by_heartbeats(last_beat: datetime) -> None:
    cluster = _healthy_cluster(last_beat)
    services.cluster_set_draining(cluster=cluster, draining=True)

    assert services.cluster_health_check(now=_after(last_beat, DOWN_AFTER * 10)) == []
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DRAINING
    assert not FailoverEvent.objects.exists()

    _beat(cluster)
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DRAINING
    assert cluster.last_heartbeat_at > last_beat


def test_resuming_a_drained_cluster_follows_how_recent_its_last_heartbeat_is(last_beat: datetime) -> None:
    silent = _healthy_cluster(last_beat)
    alive = _healthy_cluster(last_beat)
    for cluster in (silent, alive):
        services.cluster_set_draining(cluster=cluster, draining=True)
    _beat(alive)

    assert services.cluster_set_draining(cluster=silent, draining=False).status == Cluster.Status.DOWN
    alive.refresh_from_db()
    assert services.cluster_set_draining(cluster=alive, draining=False).status == Cluster.Status.HEALTHY


def test_only_silent_clusters_change_in_a_check(last_beat: datetime) -> None:
    silent = _healthy_cluster(last_beat)
    alive = _healthy_cluster(_after(last_beat, DOWN_AFTER))
    transitions = services.cluster_health_check(now=_after(last_beat, DOWN_AFTER + 1))
    assert [t.cluster_slug for t in transitions] == [silent.slug]
    alive.refresh_from_db()
    assert alive.status == Cluster.Status.HEALTHY


def test_the_periodic_task_runs_the_check_and_reports_transitions() -> None:
    long_ago = timezone.now() - timedelta(hours=2)
    cluster = _healthy_cluster(long_ago)
    assert cluster_health_check_task() == 1
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.DOWN
    assert FailoverEvent.objects.filter(from_cluster=cluster).count() == 1


def test_cluster_health_events_are_listed_by_the_api(last_beat: datetime, viewer: User) -> None:
    cluster = _healthy_cluster(last_beat)
    services.cluster_health_check(now=_after(last_beat, DOWN_AFTER + 1))
    body = api_client(viewer).get("/api/failover-events/", {"kind": "cluster-health"}).json()
    assert [(e["kind"], e["from_cluster"], e["recovered_at"]) for e in body["results"]] == [
        ("cluster-health", cluster.slug, None)
    ]
    assert api_client(viewer).get("/api/failover-events/", {"kind": "inference"}).json()["results"] == []


# --- /healthz --------------------------------------------------------------------------------------


def test_healthz_shows_an_admin_token_the_database_broker_and_each_cluster(
    last_beat: datetime, admin_user: User
) -> None:
    cluster = _healthy_cluster(last_beat)
    _beat(cluster)
    idle = make_cluster(slug="idle")

    response = api_client(admin_user).get("/healthz")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["ok"] is True
    assert body["status"] == "ok"
    assert body["database"]["ok"] is True
    assert body["database"]["vendor"] in {"sqlite", "postgresql"}
    assert body["broker"]["ok"] is True
    by_slug = {c["slug"]: c for c in body["clusters"]}
    assert by_slug[cluster.slug]["status"] == "healthy"
    assert by_slug[cluster.slug]["queue"] == f"cluster.{cluster.slug}"
    assert by_slug[cluster.slug]["seconds_since_heartbeat"] >= 0
    assert [w["hostname"] for w in by_slug[cluster.slug]["workers"]] == ["w1@host"]
    assert [w["pid"] for w in by_slug[cluster.slug]["workers"]] == [4242]
    idle_entry = {k: by_slug["idle"][k] for k in ("status", "queue", "last_heartbeat_at", "workers")}
    assert idle_entry == {"status": "down", "queue": "cluster.idle", "last_heartbeat_at": None, "workers": []}
    assert body["all_clusters_healthy"] is False
    assert idle.status == Cluster.Status.DOWN


def _assert_status_only(response: Any, last_beat_host: str = "w1@host") -> None:
    assert response.status_code == 200
    assert response.json() == {"ok": True, "status": "ok"}
    text = response.content.decode()
    for secret in (last_beat_host, "4242", "cluster.", "sqlite", "postgresql", "file://", "s3://"):
        assert secret not in text


def test_healthz_answers_anonymous_callers_with_the_status_only(last_beat: datetime) -> None:
    _beat(_healthy_cluster(last_beat))
    _assert_status_only(Client().get("/healthz"))


@pytest.mark.parametrize("role", ["viewer", "operator", "auditor"])
def test_healthz_answers_tokens_and_sessions_of_other_roles_with_the_status_only(
    last_beat: datetime, role: str, request: pytest.FixtureRequest
) -> None:
    _beat(_healthy_cluster(last_beat))
    user = request.getfixturevalue(role)
    _assert_status_only(api_client(user).get("/healthz"))
    session = Client()
    session.force_login(user)
    _assert_status_only(session.get("/healthz"))


def test_healthz_answers_a_bad_token_with_the_status_only(last_beat: datetime) -> None:
    _beat(_healthy_cluster(last_beat))
    _assert_status_only(Client(HTTP_AUTHORIZATION="Bearer sy_nope_nope").get("/healthz"))


def test_healthz_shows_the_detail_to_a_staff_session_and_an_admin_session(
    last_beat: datetime, admin_user: User
) -> None:
    _beat(_healthy_cluster(last_beat))
    staff = User.objects.create_user(username="staffer", password="pw-for-tests-1", is_staff=True)
    for user in (staff, admin_user):
        client = Client()
        client.force_login(user)
        body = client.get("/healthz").json()
        assert [w["pid"] for c in body["clusters"] for w in c["workers"]] == [4242]


def test_healthz_answers_503_degraded_to_everyone_when_the_object_store_fails(
    settings: Any, admin_user: User, s3_server: str
) -> None:
    # A real S3 endpoint whose bucket does not exist: the store answers, with an error.
    settings.OBJECT_STORE_URL = "s3://no-such-bucket/objects"
    settings.OBJECT_STORE_ENDPOINT_URL = s3_server
    anonymous = Client().get("/healthz")
    assert anonymous.status_code == 503
    assert anonymous.json() == {"ok": False, "status": "degraded"}
    detailed = api_client(admin_user).get("/healthz")
    assert detailed.status_code == 503
    assert detailed.json()["object_store"]["ok"] is False
    assert "NoSuchBucket" in detailed.json()["object_store"]["error"]
