"""Workflows and their immutable routing-policy versions (API and page)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.test import Client

from registry.models import ImmutableRowError, RoutingPolicyVersion, Workflow
from registry.selectors import workflow_current_policy
from tests.factories import api_client, make_deployment, make_team, make_workflow

pytestmark = pytest.mark.django_db


def _route(workflow: Workflow) -> list[str]:
    policy = workflow_current_policy(workflow=workflow)
    assert policy is not None
    return [d.slug for d in policy.ordered_deployments()]


def test_creating_a_workflow_makes_policy_v1_with_the_given_order(operator: User) -> None:
    for slug in ("cheap", "fast", "local"):
        make_deployment(slug=slug)
    make_team("support")
    response = api_client(operator).post(
        "/api/workflows/",
        {
            "slug": "support-bot",
            "team": "support",
            "description": "answers tickets",
            "route": {
                "deployments": ["fast", "cheap", "local"],
                "strategy": "cheapest",
                "quality_floor": "0.8000",
                "max_cost_per_request": "0.002",
            },
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["owner"] == operator.username
    assert body["current_policy"]["version"] == 1
    assert body["current_policy"]["deployments"] == ["fast", "cheap", "local"]
    assert "route" not in body

    workflow = Workflow.objects.get(slug="support-bot")
    assert workflow.owner == operator
    policy = RoutingPolicyVersion.objects.get(workflow=workflow)
    assert (policy.version, policy.strategy, policy.author, policy.reason) == (
        1,
        "cheapest",
        operator,
        "created",
    )
    assert policy.quality_floor == Decimal("0.8")
    assert policy.max_cost_per_request == Decimal("0.002")
    assert _route(workflow) == ["fast", "cheap", "local"]


@pytest.mark.parametrize(
    ("route", "field"),
    [
        ({"deployments": []}, "deployments"),
        ({"deployments": ["a", "a"]}, "deployments"),
        ({"deployments": ["a", "missing"]}, "deployments"),
        ({"deployments": ["a"], "strategy": "random"}, "strategy"),
        ({"deployments": ["a"], "quality_floor": "1.5"}, "quality_floor"),
    ],
)
def test_a_bad_route_is_400_and_writes_no_workflow(
    operator: User, route: dict[str, object], field: str
) -> None:
    make_deployment(slug="a")
    response = api_client(operator).post("/api/workflows/", {"slug": "wf", "route": route}, format="json")
    assert response.status_code == 400
    assert field in response.json()["route"]
    assert not Workflow.objects.exists()
    assert not RoutingPolicyVersion.objects.exists()


def test_a_workflow_needs_a_route(operator: User) -> None:
    response = api_client(operator).post("/api/workflows/", {"slug": "wf"}, format="json")
    assert response.status_code == 400
    assert "route" in response.json()
    assert not Workflow.objects.exists()


def test_switching_the_primary_makes_a_new_version_and_leaves_the_old_one(
    operator: User, admin_user: User
) -> None:
    a, b, c = make_deployment(slug="a"), make_deployment(slug="b"), make_deployment(slug="c")
    workflow = make_workflow(owner=admin_user, deployments=[a, b, c], slug="wf")
    v1 = workflow_current_policy(workflow=workflow)
    assert v1 is not None

    response = api_client(operator).post(
        "/api/workflows/wf/switch/", {"deployment": "c", "reason": "a is slow today"}, format="json"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["version"], body["deployments"]) == (2, ["c", "a", "b"])
    assert (body["author"], body["reason"]) == (operator.username, "a is slow today")

    v2 = RoutingPolicyVersion.objects.get(workflow=workflow, version=2)
    assert (v2.author, v2.reason) == (operator, "a is slow today")
    assert [d.slug for d in v2.ordered_deployments()] == ["c", "a", "b"]
    v1.refresh_from_db()
    assert (v1.author, v1.reason) == (admin_user, "created")
    assert [d.slug for d in v1.ordered_deployments()] == ["a", "b", "c"]
    assert _route(workflow) == ["c", "a", "b"]


def test_a_policy_version_cannot_be_saved_again() -> None:
    owner = User.objects.create_user(username="owner")
    workflow = make_workflow(owner=owner)
    policy = workflow_current_policy(workflow=workflow)
    assert policy is not None
    policy.reason = "rewritten history"
    with pytest.raises(ImmutableRowError):
        policy.save()
    policy.refresh_from_db()
    assert policy.reason == "created"


def test_switching_to_the_current_primary_is_400_and_makes_no_version(operator: User) -> None:
    a, b = make_deployment(slug="a"), make_deployment(slug="b")
    make_workflow(owner=operator, deployments=[a, b], slug="wf")
    response = api_client(operator).post(
        "/api/workflows/wf/switch/", {"deployment": "a", "reason": "again"}, format="json"
    )
    assert response.status_code == 400
    assert "already the primary" in response.json()["deployment"][0]
    assert RoutingPolicyVersion.objects.count() == 1


@pytest.mark.parametrize("body", [{"deployment": "b"}, {"deployment": "b", "reason": ""}])
def test_switching_without_a_reason_is_400_and_makes_no_version(operator: User, body: dict[str, str]) -> None:
    a, b = make_deployment(slug="a"), make_deployment(slug="b")
    make_workflow(owner=operator, deployments=[a, b], slug="wf")
    response = api_client(operator).post("/api/workflows/wf/switch/", body, format="json")
    assert response.status_code == 400
    assert "reason" in response.json()
    assert RoutingPolicyVersion.objects.count() == 1


def test_switching_to_a_disabled_deployment_is_400(operator: User) -> None:
    a = make_deployment(slug="a")
    off = make_deployment(slug="off", enabled=False)
    make_workflow(owner=operator, deployments=[a], slug="wf")
    response = api_client(operator).post(
        "/api/workflows/wf/switch/", {"deployment": off.slug, "reason": "try"}, format="json"
    )
    assert response.status_code == 400
    assert "deployment" in response.json()
    assert RoutingPolicyVersion.objects.count() == 1


def test_switching_to_a_deployment_outside_the_route_puts_it_first(operator: User) -> None:
    a, b, new = make_deployment(slug="a"), make_deployment(slug="b"), make_deployment(slug="new")
    workflow = make_workflow(owner=operator, deployments=[a, b], slug="wf")
    response = api_client(operator).post(
        "/api/workflows/wf/switch/", {"deployment": new.slug, "reason": "trial"}, format="json"
    )
    assert response.status_code == 201
    assert _route(workflow) == ["new", "a", "b"]


def test_a_viewer_cannot_switch_the_primary(viewer: User, operator: User) -> None:
    a, b = make_deployment(slug="a"), make_deployment(slug="b")
    make_workflow(owner=operator, deployments=[a, b], slug="wf")
    response = api_client(viewer).post(
        "/api/workflows/wf/switch/", {"deployment": "b", "reason": "x"}, format="json"
    )
    assert response.status_code == 403
    assert RoutingPolicyVersion.objects.count() == 1


def test_replacing_the_whole_route_records_a_version_with_its_knobs(operator: User) -> None:
    a = make_deployment(slug="a")
    make_deployment(slug="b")
    workflow = make_workflow(owner=operator, deployments=[a], slug="wf")
    response = api_client(operator).post(
        "/api/workflows/wf/policy/",
        {"deployments": ["b", "a"], "strategy": "fastest", "reason": "latency matters now"},
        format="json",
    )
    assert response.status_code == 201, response.json()
    policy = workflow_current_policy(workflow=workflow)
    assert policy is not None
    assert (policy.version, policy.strategy, policy.reason) == (2, "fastest", "latency matters now")
    assert _route(workflow) == ["b", "a"]


def test_the_versions_endpoint_lists_newest_first(operator: User) -> None:
    a, b = make_deployment(slug="a"), make_deployment(slug="b")
    make_workflow(owner=operator, deployments=[a, b], slug="wf")
    client = api_client(operator)
    client.post("/api/workflows/wf/switch/", {"deployment": "b", "reason": "one"}, format="json")
    client.post("/api/workflows/wf/switch/", {"deployment": "a", "reason": "two"}, format="json")
    versions = client.get("/api/workflows/wf/versions/").json()
    assert [(v["version"], v["reason"], v["deployments"]) for v in versions] == [
        (3, "two", ["a", "b"]),
        (2, "one", ["b", "a"]),
        (1, "created", ["a", "b"]),
    ]


def test_updating_a_workflow_does_not_touch_its_route(operator: User) -> None:
    a, b = make_deployment(slug="a"), make_deployment(slug="b")
    workflow = make_workflow(owner=operator, deployments=[a, b], slug="wf")
    response = api_client(operator).patch(
        "/api/workflows/wf/",
        {"description": "new words", "route": {"deployments": ["b"]}},
        format="json",
    )
    assert response.status_code == 200
    workflow.refresh_from_db()
    assert workflow.description == "new words"
    assert RoutingPolicyVersion.objects.count() == 1
    assert _route(workflow) == ["a", "b"]


# --- The workflow page ------------------------------------------------------------------------


def _page_client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_workflow_page_switches_the_primary_through_its_form(operator: User) -> None:
    a, b = make_deployment(slug="a"), make_deployment(slug="b")
    workflow = make_workflow(owner=operator, deployments=[a, b], slug="wf")
    client = _page_client(operator)
    page = client.get("/workflows/wf/")
    assert page.status_code == 200
    assert "Switch primary deployment" in page.content.decode()

    response = client.post("/workflows/wf/", {"deployment": b.pk, "reason": "b is cheaper this week"})
    assert response.status_code == 302
    assert response["Location"] == "/workflows/wf/"
    v2 = RoutingPolicyVersion.objects.get(workflow=workflow, version=2)
    assert (v2.author, v2.reason) == (operator, "b is cheaper this week")
    assert _route(workflow) == ["b", "a"]

    after = client.get("/workflows/wf/").content.decode()
    assert "Primary is now b (policy v2)." in after
    assert "b is cheaper this week" in after


@pytest.mark.parametrize(
    ("form", "error"),
    [
        ({"deployment": "A", "reason": ""}, "This field is required."),
        ({"deployment": "A", "reason": "same"}, "already the primary deployment"),
        ({"deployment": "999999", "reason": "ghost"}, "Select a valid choice."),
    ],
)
def test_a_bad_switch_on_the_page_shows_the_error_and_makes_no_version(
    operator: User, form: dict[str, str], error: str
) -> None:
    a, b = make_deployment(slug="a"), make_deployment(slug="b")
    make_workflow(owner=operator, deployments=[a, b], slug="wf")
    data = {**form, "deployment": str(a.pk) if form["deployment"] == "A" else form["deployment"]}
    response = _page_client(operator).post("/workflows/wf/", data)
    assert response.status_code == 400
    assert error in response.content.decode()
    assert RoutingPolicyVersion.objects.count() == 1


def test_a_viewer_sees_the_workflow_page_without_the_switch_form_and_cannot_post(
    viewer: User, operator: User
) -> None:
    a, b = make_deployment(slug="a"), make_deployment(slug="b")
    make_workflow(owner=operator, deployments=[a, b], slug="wf")
    client = _page_client(viewer)
    page = client.get("/workflows/wf/")
    assert page.status_code == 200
    assert "Switch primary deployment" not in page.content.decode()
    assert client.post("/workflows/wf/", {"deployment": b.pk, "reason": "x"}).status_code == 403
    assert RoutingPolicyVersion.objects.count() == 1


def test_an_unknown_workflow_page_is_404(viewer: User) -> None:
    assert _page_client(viewer).get("/workflows/nope/").status_code == 404
