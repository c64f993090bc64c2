"""/api/teams/: members read their teams, platform admins create and delete them, a team's admins
change its name, limits and members (never another team's), and each change leaves an audit row."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.contenttypes.models import ContentType

from registry.audit.models import AuditEntry
from registry.auth.roles import Role
from registry.models import Team, TeamMembership
from registry.services import api_token_create
from tests.factories import api_client, make_member, make_team, make_user, make_workflow

pytestmark = pytest.mark.django_db


@pytest.fixture
def teams() -> dict[str, Any]:
    alpha, bravo = make_team("alpha", name="Alpha"), make_team("bravo", name="Bravo")
    return {
        "alpha": alpha,
        "bravo": bravo,
        "alpha_admin": make_member(alpha, Role.ADMIN, user=make_user(username="alpha-admin")),
        "alpha_operator": make_member(alpha, Role.OPERATOR, user=make_user(username="alpha-operator")),
        "alpha_viewer": make_member(alpha, Role.VIEWER, user=make_user(username="alpha-viewer")),
        "bravo_admin": make_member(bravo, Role.ADMIN, user=make_user(username="bravo-admin")),
    }


def _audit(model: type, pk: Any) -> list[AuditEntry]:
    content_type = ContentType.objects.get_for_model(model)
    return list(AuditEntry.objects.filter(content_type=content_type, object_pk=str(pk)).order_by("id"))


def _slugs(response: Any) -> set[str]:
    assert response.status_code == 200, response.content
    body = response.json()
    return {row["slug"] for row in (body["results"] if "results" in body else body)}


def test_a_member_lists_its_teams_and_a_platform_role_every_team(teams: dict[str, Any]) -> None:
    assert _slugs(api_client(teams["alpha_viewer"]).get("/api/teams/")) == {"alpha"}
    assert _slugs(api_client(make_user(Role.VIEWER)).get("/api/teams/")) == {"alpha", "bravo"}
    assert api_client(teams["alpha_viewer"]).get("/api/teams/bravo/").status_code == 404
    assert api_client(make_user()).get("/api/teams/").status_code == 403  # no role, no team


def test_a_platform_admin_creates_a_team_and_the_trail_records_it(admin_user: User) -> None:
    client = api_client(admin_user)
    response = client.post(
        "/api/teams/", {"slug": "search", "name": "Search", "rpm_limit": 600}, format="json"
    )
    assert response.status_code == 201, response.json()
    team = Team.objects.get(slug="search")
    assert (team.name, team.rpm_limit, team.tpm_limit) == ("Search", 600, None)
    [entry] = _audit(Team, team.pk)
    assert (entry.actor_label, entry.surface, entry.get_action_display()) == (
        admin_user.username,
        "api",
        "create",
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"slug": "Search", "name": "x"}, "slug"),
        ({"slug": "-search", "name": "x"}, "slug"),
        ({"slug": "se--arch", "name": "x"}, "slug"),
        ({"slug": "a/b", "name": "x"}, "slug"),
        ({"slug": "s" * 65, "name": "x"}, "slug"),
        ({"slug": "alpha", "name": "x"}, "slug"),  # exists already
        ({"slug": "search", "name": ""}, "name"),
        ({"slug": "search", "name": "bell\x07"}, "name"),
        ({"slug": "search", "name": "x", "rpm_limit": -1}, "rpm_limit"),
        ({"slug": "search", "name": "x", "tpm_limit": 2**31}, "tpm_limit"),
    ],
)
def test_a_bad_team_is_refused_naming_its_field(
    admin_user: User, teams: dict[str, Any], body: dict[str, Any], field: str
) -> None:
    response = api_client(admin_user).post("/api/teams/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert set(Team.objects.values_list("slug", flat=True)) == {"alpha", "bravo"}


@pytest.mark.parametrize("who", ["alpha_admin", "global_operator"])
def test_only_platform_admins_create_and_delete_teams(teams: dict[str, Any], who: str) -> None:
    user = teams.get(who) or make_user(Role.OPERATOR)
    client = api_client(user)
    assert client.post("/api/teams/", {"slug": "mine", "name": "Mine"}, format="json").status_code == 403
    assert client.delete("/api/teams/alpha/").status_code == 403
    assert set(Team.objects.values_list("slug", flat=True)) == {"alpha", "bravo"}


def test_a_team_that_owns_workflows_is_not_deleted(admin_user: User, teams: dict[str, Any]) -> None:
    make_workflow(owner=admin_user, team=teams["alpha"])
    client = api_client(admin_user)
    refused = client.delete("/api/teams/alpha/")
    assert refused.status_code == 400
    assert "1 workflows" in refused.json()["non_field_errors"][0]
    assert client.delete("/api/teams/bravo/").status_code == 204
    assert not Team.objects.filter(slug="bravo").exists()
    assert not TeamMembership.objects.filter(user=teams["bravo_admin"]).exists()


def test_a_team_admin_changes_its_teams_name_and_limits_but_never_its_slug(teams: dict[str, Any]) -> None:
    client = api_client(teams["alpha_admin"])
    response = client.patch(
        "/api/teams/alpha/", {"name": "Alpha squad", "tpm_limit": 90000, "slug": "renamed"}, format="json"
    )
    assert response.status_code == 200, response.json()
    team = Team.objects.get(pk=teams["alpha"].pk)
    assert (team.slug, team.name, team.tpm_limit, team.rpm_limit) == ("alpha", "Alpha squad", 90000, None)
    update = _audit(Team, team.pk)[-1]
    assert update.get_action_display() == "update"
    assert update.changes_dict["name"] == ["Alpha", "Alpha squad"]


def test_a_team_admin_cannot_change_another_team_and_an_operator_not_its_own(teams: dict[str, Any]) -> None:
    admin = api_client(teams["alpha_admin"])
    assert admin.patch("/api/teams/bravo/", {"name": "mine"}, format="json").status_code == 404
    assert (
        admin.post("/api/teams/bravo/members/", {"user": "alpha-admin", "role": "admin"}).status_code == 404
    )
    operator = api_client(teams["alpha_operator"])
    assert operator.patch("/api/teams/alpha/", {"name": "mine"}, format="json").status_code == 403
    global_operator = api_client(make_user(Role.OPERATOR))
    assert global_operator.patch("/api/teams/alpha/", {"name": "mine"}, format="json").status_code == 403
    assert set(Team.objects.values_list("name", flat=True)) == {"Alpha", "Bravo"}


def test_members_read_the_member_list(teams: dict[str, Any]) -> None:
    response = api_client(teams["alpha_viewer"]).get("/api/teams/alpha/members/")
    assert response.status_code == 200
    assert {(m["user"], m["role"]) for m in response.json()} == {
        ("alpha-admin", "admin"),
        ("alpha-operator", "operator"),
        ("alpha-viewer", "viewer"),
    }


def test_a_team_admin_adds_changes_and_removes_members_and_each_change_is_audited(
    teams: dict[str, Any],
) -> None:
    newcomer = make_user(username="newcomer")
    client = api_client(teams["alpha_admin"])
    added = client.post("/api/teams/alpha/members/", {"user": "newcomer", "role": "viewer"}, format="json")
    assert added.status_code == 201, added.json()
    membership = TeamMembership.objects.get(team=teams["alpha"], user=newcomer)
    assert (membership.role, membership.source) == ("viewer", "manual")
    promoted = client.patch("/api/teams/alpha/members/newcomer/", {"role": "operator"}, format="json")
    assert promoted.status_code == 200 and promoted.json()["role"] == "operator"
    # The new role takes effect at once: the newcomer may now change the team's workflows.
    workflow = make_workflow(owner=teams["alpha_admin"], team=teams["alpha"])
    changed = api_client(newcomer).patch(
        f"/api/workflows/{workflow.slug}/", {"description": "d"}, format="json"
    )
    assert changed.status_code == 200
    removed = client.delete("/api/teams/alpha/members/newcomer/")
    assert removed.status_code == 204
    assert not TeamMembership.objects.filter(user=newcomer).exists()
    actions = [e.get_action_display() for e in _audit(TeamMembership, membership.pk)]
    assert actions == ["create", "update", "delete"]
    assert client.delete("/api/teams/alpha/members/newcomer/").status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"user": "nobody", "role": "viewer"}, "user"),
        ({"user": "alpha-viewer", "role": "owner"}, "role"),
        ({"user": "alpha-viewer", "role": "superuser"}, "role"),
        ({"user": "alpha-viewer"}, "role"),
    ],
)
def test_a_bad_membership_is_refused_naming_its_field(
    teams: dict[str, Any], body: dict[str, Any], field: str
) -> None:
    response = api_client(teams["alpha_admin"]).post("/api/teams/alpha/members/", body, format="json")
    assert response.status_code == 400 and field in response.json(), response.json()
    assert TeamMembership.objects.get(user=teams["alpha_viewer"]).role == "viewer"


def test_a_team_operator_or_viewer_cannot_manage_members(teams: dict[str, Any]) -> None:
    for who in ("alpha_operator", "alpha_viewer"):
        client = api_client(teams[who])
        body = {"user": "alpha-viewer", "role": "admin"}
        assert client.post("/api/teams/alpha/members/", body, format="json").status_code == 403
        assert client.patch("/api/teams/alpha/members/alpha-viewer/", {"role": "admin"}).status_code == 403
        assert client.delete("/api/teams/alpha/members/alpha-admin/").status_code == 403
    assert TeamMembership.objects.get(user=teams["alpha_viewer"]).role == "viewer"
    assert TeamMembership.objects.filter(user=teams["alpha_admin"]).exists()


def test_a_team_admin_grants_roles_in_its_team_only(teams: dict[str, Any]) -> None:
    """Making someone admin of team A gives them team A, not the platform and not team B."""
    newcomer = make_user(username="newcomer")
    client = api_client(teams["alpha_admin"])
    assert (
        client.post(
            "/api/teams/alpha/members/", {"user": "newcomer", "role": "admin"}, format="json"
        ).status_code
        == 201
    )
    assert not newcomer.groups.exists()
    newcomer_client = api_client(newcomer)
    assert _slugs(newcomer_client.get("/api/teams/")) == {"alpha"}
    assert newcomer_client.post("/api/teams/", {"slug": "x", "name": "X"}, format="json").status_code == 403
    assert newcomer_client.get("/api/audit/").status_code == 403


def test_a_team_key_manages_its_own_team_only(teams: dict[str, Any]) -> None:
    user = teams["alpha_admin"]
    make_member(teams["bravo"], Role.ADMIN, user=user)
    _, raw = api_token_create(user=user, name="alpha key", team=teams["alpha"])
    client = api_client(user)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.patch("/api/teams/alpha/", {"name": "A"}, format="json").status_code == 200
    assert client.patch("/api/teams/bravo/", {"name": "B"}, format="json").status_code == 404
