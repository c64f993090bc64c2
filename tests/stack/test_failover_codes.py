"""Failover codes on the API, the failover page and its CSV, and the migration that gave old rows
a code read from their free-text reason."""

from __future__ import annotations

import csv
import io
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from registry.failover_codes import FailoverCode
from registry.models import FailoverEvent
from registry.services import failover_event_record
from tests.factories import api_client, make_cluster, make_deployment
from tests.migration_db import migrate_to


def _events() -> tuple[FailoverEvent, FailoverEvent]:
    now = timezone.now()
    cluster = make_cluster()
    down = failover_event_record(
        kind=FailoverEvent.Kind.CLUSTER_HEALTH,
        code=FailoverCode.HEARTBEAT_TIMEOUT,
        reason="healthy → down: no worker heartbeat for 31s",
        detected_at=now,
        from_cluster=cluster,
    )
    limited = failover_event_record(
        kind=FailoverEvent.Kind.INFERENCE,
        code=FailoverCode.HTTP_429,
        reason="=HYPERLINK(a) → b: HTTP 429 from a",
        detected_at=now,
        from_deployment=make_deployment(),
        status_code=429,
        extra_cost=Decimal("0.25"),
    )
    return down, limited


def _page(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_an_event_needs_a_code_of_the_taxonomy(db: Any) -> None:
    with pytest.raises(ValueError, match="unknown failover code"):
        failover_event_record(
            kind=FailoverEvent.Kind.TRAINING, code="cosmic_ray", reason="x", detected_at=timezone.now()
        )
    assert not FailoverEvent.objects.exists()


@pytest.mark.django_db
def test_the_api_filters_failover_events_by_code(viewer: User) -> None:
    down, limited = _events()
    client = api_client(viewer)
    body = client.get("/api/failover-events/", {"code": "http_429"}).json()
    assert [(e["id"], e["code"]) for e in body["results"]] == [(limited.pk, "http_429")]
    body = client.get("/api/failover-events/", {"code": "heartbeat_timeout", "kind": "cluster-health"}).json()
    assert [e["id"] for e in body["results"]] == [down.pk]
    assert client.get("/api/failover-events/", {"code": "circuit_open"}).json()["results"] == []


@pytest.mark.django_db
def test_an_unknown_code_is_a_400_naming_the_field(viewer: User) -> None:
    _events()
    response = api_client(viewer).get("/api/failover-events/", {"code": "http_999"})
    assert response.status_code == 400
    assert "code" in response.json() and "http_429" in str(response.json()["code"])


@pytest.mark.django_db
def test_the_failover_page_filters_by_code_and_refuses_an_unknown_one_with_a_form_error(viewer: User) -> None:
    down, limited = _events()
    client = _page(viewer)
    page = client.get("/failovers/", {"code": "heartbeat_timeout"})
    assert page.status_code == 200
    shown = [e.pk for e in page.context["events"]]
    assert shown == [down.pk]
    bad = client.get("/failovers/", {"code": "nope"})
    assert bad.status_code == 400
    assert "code" in bad.context["form"].errors and list(bad.context["events"]) == []
    assert b"Select a valid choice" in bad.content


@pytest.mark.django_db
def test_the_csv_export_follows_the_filter_and_shows_money_only_to_roles_that_see_costs(
    viewer: User, operator: User
) -> None:
    _events()
    for user, has_cost in ((viewer, False), (operator, True)):
        response = _page(user).get("/failovers/", {"code": "http_429", "format": "csv"})
        assert response["Content-Type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(response.content.decode())))
        assert [(r["code"], r["status_code"]) for r in rows] == [("http_429", "429")]
        # A reason that would be a spreadsheet formula is kept as text.
        assert rows[0]["reason"].startswith("'=HYPERLINK")
        assert ("extra_cost" in rows[0]) is has_cost


BEFORE = ("stack", "0011_failover_code")
AFTER = ("stack", "0012_failover_codes_from_reasons")


def test_the_migration_codes_old_events_from_their_reasons_and_leaves_the_rest_other(scratch_db: str) -> None:
    alias = scratch_db  # the test database is not used, only the scratch one
    Event = migrate_to(alias, BEFORE).get_model("stack", "FailoverEvent")
    now = timezone.now()
    old = [
        ("cluster-health", "degraded → down: no worker heartbeat for 31s", None, "heartbeat_timeout"),
        ("training", "learner 0: interrupted: cluster spot is reclaimed (spot interruption notice)", None,
         "preemption"),
        ("training", "learner 1: chunk 3 failed: LookupError: x", None, "chunk_failed"),
        ("training", "learner 1: no report for 95s (learner_timeout 60s)", None, "worker_lost"),
        ("training", "learner 0: cluster gpu-a is down", None, "heartbeat_timeout"),
        ("training", "learner 0: cluster gpu-a: hard budget team-x spent", None, "budget_exhausted"),
        ("inference", "a → b: HTTP 503 from a", 503, "http_5xx"),
        ("inference", "a → b: HTTP 429 from a", 429, "http_429"),
        ("inference", "a → b: malformed answer from a", 200, "malformed_response"),
        ("inference", "a → b: timed out after 2.00s calling 10.0.0.1:443", None, "timeout"),
        ("inference", "a → b: cannot reach 10.0.0.1:443: refused", None, "connection_error"),
        ("inference", "quality demotion: a rolling score 0.300 below the floor 0.600 of w", None,
         "quality_demotion"),
        ("inference", "something nobody wrote down", None, "other"),
    ]  # fmt: skip
    ids = [
        Event.objects.using(alias).create(kind=kind, reason=reason, status_code=status, detected_at=now).pk
        for kind, reason, status, _ in old
    ]
    Event = migrate_to(alias, AFTER).get_model("stack", "FailoverEvent")
    codes = dict(Event.objects.using(alias).filter(pk__in=ids).values_list("pk", "code"))
    assert [codes[pk] for pk in ids] == [expected for *_, expected in old]


@pytest.mark.django_db
def test_the_billing_dashboard_sums_failover_cost_per_code_linking_to_the_filtered_list(
    auditor: User,
) -> None:
    _events()
    page = _page(auditor).get("/billing/")
    assert page.status_code == 200
    assert [(f["kind"], f["code"], f["total"]) for f in page.context["failover_costs"]] == [
        ("inference", "http_429", Decimal("0.25"))
    ]
    assert 'href="/failovers/?kind=inference&amp;code=http_429"' in page.content.decode()
