"""The auditors' API (/api/audit/), page (/audit/) and CSV export: who may read them, and that
their filters select the right rows."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from registry.audit.origin import Surface, audit_origin
from registry.auth.roles import Role
from tests.factories import api_client, make_provider, make_user

pytestmark = pytest.mark.django_db

T0 = timezone.now().replace(microsecond=0) - timedelta(days=3)


@pytest.fixture
def trail() -> dict[str, Any]:
    """Three changes by two actors on three days."""
    with time_machine.travel(T0, tick=False), audit_origin(surface=Surface.COMMAND, label="command:seed"):
        provider = make_provider(region="eu-west-1")
    with (
        time_machine.travel(T0 + timedelta(days=1), tick=False),
        audit_origin(surface=Surface.TASK, label="task:t"),
    ):
        provider.region = "us-east-2"
        provider.save()
    with (
        time_machine.travel(T0 + timedelta(days=2), tick=False),
        audit_origin(surface=Surface.COMMAND, label="command:seed"),
    ):
        group = Group.objects.create(name="trail-group")
    return {"provider": provider, "group": group}


@pytest.mark.parametrize("role", [Role.VIEWER, Role.OPERATOR, None])
def test_viewers_and_operators_are_refused(role: Role | None) -> None:
    user = make_user(role)
    assert api_client(user).get("/api/audit/").status_code == 403
    assert api_client(user).get("/api/audit/export/").status_code == 403
    client = Client()
    client.force_login(user)
    assert client.get("/audit/").status_code == 403
    assert client.get("/audit/export.csv").status_code == 403


def test_anonymous_callers_are_refused() -> None:
    assert Client().get("/api/audit/").status_code == 401
    assert Client().get("/audit/").status_code == 302


@pytest.mark.parametrize("role", [Role.AUDITOR, Role.ADMIN])
def test_auditors_and_admins_read_the_trail_paginated(role: Role, trail: dict[str, Any]) -> None:
    body = api_client(make_user(role)).get("/api/audit/?limit=2").json()
    assert set(body) >= {"count", "next", "previous", "results"} and len(body["results"]) == 2
    first = body["results"][0]
    assert set(first) == {
        "id",
        "timestamp",
        "actor",
        "surface",
        "action",
        "object_type",
        "object_id",
        "object_repr",
        "changes",
    }


def _ids(client: Any, query: str) -> list[tuple[str, str, str]]:
    response = client.get("/api/audit/" + query)
    assert response.status_code == 200, response.content
    return [(r["object_type"], r["action"], r["actor"]) for r in response.json()["results"]]


def test_the_filters_select_by_object_actor_surface_and_time(auditor: User, trail: dict[str, Any]) -> None:
    client = api_client(auditor)
    provider = trail["provider"]
    assert _ids(client, f"?object_type=stack.provider&object_id={provider.pk}") == [
        ("stack.provider", "update", "task:t"),
        ("stack.provider", "create", "command:seed"),
    ]
    assert _ids(client, "?actor=task:t") == [("stack.provider", "update", "task:t")]
    assert _ids(client, "?surface=task") == [("stack.provider", "update", "task:t")]
    since, until = (T0 + timedelta(hours=12)).isoformat(), (T0 + timedelta(days=1, hours=12)).isoformat()
    assert _ids(client, f"?since={since.replace('+', '%2B')}&until={until.replace('+', '%2B')}") == [
        ("stack.provider", "update", "task:t")
    ]
    changes = client.get(
        f"/api/audit/?object_type=stack.provider&object_id={provider.pk}&surface=task"
    ).json()
    assert changes["results"][0]["changes"]["region"] == ["eu-west-1", "us-east-2"]


@pytest.mark.parametrize(
    "query, field",
    [
        ("?object_type=nope.model", "object_type"),
        ("?object_id=4", "object_id"),
        ("?since=yesterday", "since"),
        ("?surface=mail", "surface"),
        ("?objecttype=stack.provider", "objecttype"),
    ],
)
def test_bad_filters_answer_400_naming_the_field(auditor: User, query: str, field: str) -> None:
    response = api_client(auditor).get("/api/audit/" + query)
    assert response.status_code == 400
    assert field in response.json()


def test_the_page_lists_and_filters_for_auditors(auditor: User, trail: dict[str, Any]) -> None:
    client = Client()
    client.force_login(auditor)
    page = client.get("/audit/?actor=task:t").content.decode()
    assert "us-east-2" in page and "trail-group" not in page
    assert client.get("/audit/").content.decode().count("trail-group") >= 1
    assert client.get("/audit/?since=nonsense").status_code == 400


def test_the_export_streams_csv_of_the_filtered_rows(auditor: User, trail: dict[str, Any]) -> None:
    for response in (
        api_client(auditor).get("/api/audit/export/?object_type=stack.provider"),
        _page_client(auditor).get("/audit/export.csv?object_type=stack.provider"),
    ):
        assert response.status_code == 200
        assert response.streaming
        assert response["Content-Type"].startswith("text/csv")
        assert "attachment" in response["Content-Disposition"]
        rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
        assert [(r["object_type"], r["action"], r["actor"]) for r in rows] == [
            ("stack.provider", "update", "task:t"),
            ("stack.provider", "create", "command:seed"),
        ]
        assert '"eu-west-1", "us-east-2"' in rows[0]["changes"]


def test_the_export_defuses_spreadsheet_formulas(auditor: User) -> None:
    with audit_origin(surface=Surface.COMMAND, label="=HYPERLINK(evil)"):
        Group.objects.create(name="@formula")
    response = _page_client(auditor).get("/audit/export.csv?object_type=auth.group")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[0]["actor"] == "'=HYPERLINK(evil)" and rows[0]["object_repr"] == "'@formula"


def _page_client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client
