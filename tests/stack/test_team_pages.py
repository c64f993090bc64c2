"""Pages for team-scoped users: each sees its teams' rows only, another team's object is a 404,
the dashboards filter by team (?team=), and the team page lists members, keys, budgets, limits and
spend; its admins manage members there."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from billing.models import Budget, Unit
from billing.services import usage_record
from registry.auth.roles import Role
from registry.models import ApiToken, Team, TeamMembership, Workflow
from registry.services import api_token_create, team_membership_set
from tests.factories import make_cluster, make_deployment, make_user, make_workflow
from training.models import TrainingRun

pytestmark = pytest.mark.django_db


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _text(response: Any) -> str:
    return str(response.content.decode())


def _member(team: Team, role: Role, username: str) -> User:
    user = make_user(username=username)  # no global role: team-scoped
    team_membership_set(team=team, user=user, role=role)
    return user


@dataclass
class Teams:
    alpha: Team
    beta: Team
    alpha_op: User
    alpha_admin: User
    alpha_viewer: User
    beta_op: User
    wf_alpha: Workflow
    wf_beta: Workflow
    run_alpha: TrainingRun
    run_beta: TrainingRun
    budget_alpha: Budget
    budget_beta: Budget
    budget_wf_beta: Budget
    key_raw: str
    key: ApiToken


@pytest.fixture
def teams(admin_user: User) -> Teams:
    alpha = Team.objects.create(slug="alpha", name="Alpha", rpm_limit=120, tpm_limit=50_000)
    beta = Team.objects.create(slug="beta", name="Beta")
    cluster = make_cluster(slug="shared-rack", price=Decimal("2.000000"))
    wf_alpha = make_workflow(owner=admin_user, slug="wf-alpha", team=alpha, deployments=[make_deployment()])
    wf_beta = make_workflow(owner=admin_user, slug="wf-beta", team=beta, deployments=[make_deployment()])
    run_alpha = TrainingRun.objects.create(name="run-of-alpha", config={}, team=alpha)
    run_beta = TrainingRun.objects.create(name="run-of-beta", config={}, team=beta)
    budget_alpha = Budget.objects.create(
        name="alpha-monthly", scope=Budget.Scope.TEAM, team="alpha", limit_amount=Decimal("100")
    )
    budget_beta = Budget.objects.create(
        name="beta-monthly", scope=Budget.Scope.TEAM, team="beta", limit_amount=Decimal("100")
    )
    budget_wf_beta = Budget.objects.create(
        name="wf-beta-budget", scope=Budget.Scope.WORKFLOW, workflow=wf_beta, limit_amount=Decimal("9")
    )
    # Spend today: 3 accelerator-hours for alpha (6.00), 5 for beta (10.00).
    for slug, hours in (("alpha", 3), ("beta", 5)):
        usage_record(
            unit=Unit.ACCELERATOR_HOUR,
            quantity=Decimal(hours),
            occurred_at=timezone.now() - timedelta(minutes=5),
            idempotency_key=f"teams:{slug}",
            subject_type="test",
            subject_id=slug,
            cluster=cluster,
            team=slug,
        )
    alpha_admin = _member(alpha, Role.ADMIN, "alpha-admin")
    key, raw = api_token_create(
        user=alpha_admin, name="alpha-ci", workflows=[wf_alpha], rpm_limit=60, team=alpha
    )
    return Teams(
        alpha=alpha,
        beta=beta,
        alpha_op=_member(alpha, Role.OPERATOR, "alpha-op"),
        alpha_admin=alpha_admin,
        alpha_viewer=_member(alpha, Role.VIEWER, "alpha-viewer"),
        beta_op=_member(beta, Role.OPERATOR, "beta-op"),
        wf_alpha=wf_alpha,
        wf_beta=wf_beta,
        run_alpha=run_alpha,
        run_beta=run_beta,
        budget_alpha=budget_alpha,
        budget_beta=budget_beta,
        budget_wf_beta=budget_wf_beta,
        key_raw=raw,
        key=key,
    )


# --- Another team's objects are 404 ---------------------------------------------------------------


def test_a_team_operator_gets_404_on_another_teams_workflow_run_budget_and_team_pages(teams: Teams) -> None:
    client = _client(teams.alpha_op)
    for url in (
        "/workflows/wf-beta/",
        "/inference/workflows/wf-beta/",
        f"/training/{teams.run_beta.pk}/",
        f"/training/{teams.run_beta.pk}/metrics.json",
        f"/billing/budgets/{teams.budget_beta.pk}/edit/",
        f"/billing/budgets/{teams.budget_wf_beta.pk}/edit/",
        "/teams/beta/",
    ):
        assert client.get(url).status_code == 404, url
    for url in (
        "/workflows/wf-alpha/",
        "/inference/workflows/wf-alpha/",
        f"/training/{teams.run_alpha.pk}/",
        f"/billing/budgets/{teams.budget_alpha.pk}/edit/",
        "/teams/alpha/",
    ):
        assert client.get(url).status_code == 200, url
    # Writes on another team's objects are 404 as well, and change nothing.
    assert client.post(f"/training/{teams.run_beta.pk}/cancel/", {"reason": "x"}).status_code == 404
    assert client.post("/workflows/wf-beta/", {"reason": "x"}).status_code == 404
    teams.run_beta.refresh_from_db()
    assert teams.run_beta.state == TrainingRun.State.PENDING


def test_lists_show_only_the_callers_teams_rows(teams: Teams) -> None:
    client = _client(teams.alpha_op)
    checks = {
        "/workflows/": ("wf-alpha", "wf-beta"),
        "/inference/": ("wf-alpha", "wf-beta"),
        "/training/": ("run-of-alpha", "run-of-beta"),
        "/billing/budgets/": ("alpha-monthly", "beta-monthly"),
        "/teams/": ('data-team="alpha"', 'data-team="beta"'),
    }
    for url, (mine, theirs) in checks.items():
        html = _text(client.get(url))
        assert mine in html and theirs not in html, url
    assert "wf-beta-budget" not in _text(client.get("/billing/budgets/"))
    # The ledger rows page: alpha's row only; a filter naming beta finds nothing.
    html = _text(client.get("/billing/ledger/"))
    assert "6.000000000" in html and "10.000000000" not in html
    html = _text(client.get("/billing/ledger/?team=beta"))
    assert "No rows." in html and "10.000000000" not in html
    # A platform admin still sees every team.
    html = _text(_client(make_user(Role.ADMIN)).get("/workflows/"))
    assert "wf-alpha" in html and "wf-beta" in html


def test_shared_registry_pages_are_read_only_and_platform_pages_forbidden_for_team_users(
    teams: Teams,
) -> None:
    client = _client(teams.alpha_admin)
    clusters = client.get("/clusters/")
    assert clusters.status_code == 200 and "shared-rack" in _text(clusters)
    assert "/clusters/new/" not in _text(clusters) and "/edit/" not in _text(clusters)
    for url in ("/clusters/new/", "/deployments/new/", "/audit/", "/billing/reconciliation/"):
        assert client.get(url).status_code == 403, url
    assert client.get("/billing/prices/").status_code == 200


def test_writes_need_operator_in_the_objects_team(teams: Teams) -> None:
    dep = teams.wf_alpha.policy_versions.get().ordered_deployments()[0]
    refused = _client(teams.alpha_viewer).post(
        f"/training/{teams.run_alpha.pk}/cancel/", {"reason": "not mine to stop"}
    )
    assert refused.status_code == 403
    refused = _client(teams.alpha_viewer).post("/workflows/wf-alpha/", {"deployment": dep.pk, "reason": "x"})
    assert refused.status_code == 403
    allowed = _client(teams.alpha_op).post(f"/training/{teams.run_alpha.pk}/cancel/", {"reason": "done"})
    assert allowed.status_code == 302
    teams.run_alpha.refresh_from_db()
    assert teams.run_alpha.state == TrainingRun.State.CANCELLED


# --- Budgets and exports: own teams only --------------------------------------------------------


def test_a_team_operator_creates_budgets_only_for_its_teams(teams: Teams) -> None:
    client = _client(teams.alpha_op)
    form = _text(client.get("/billing/budgets/new/"))
    assert 'value="alpha"' in form and 'value="beta"' not in form and "wf-beta" not in form
    base = {"scope": "team", "period": "monthly", "limit_amount": "5", "currency": "USD", "active": "on"}
    refused = client.post("/billing/budgets/new/", {**base, "name": "sneaky", "team": "beta"})
    assert refused.status_code == 400 and "no team beta that you operate" in _text(refused)
    refused = client.post(
        "/billing/budgets/new/",
        {**base, "name": "sneaky-wf", "scope": "workflow", "workflow": teams.wf_beta.pk},
    )
    assert refused.status_code == 400
    assert not Budget.objects.filter(name__startswith="sneaky").exists()
    made = client.post("/billing/budgets/new/", {**base, "name": "alpha-small", "team": "alpha"})
    assert made.status_code == 302
    assert Budget.objects.get(name="alpha-small").team == "alpha"


def test_a_team_user_exports_only_its_teams_rows(teams: Teams) -> None:
    client = _client(teams.alpha_op)
    refused = client.post("/billing/export/", {"team": "beta", "format": "csv"})
    assert refused.status_code == 400 and "no team beta that you can see" in _text(refused)
    download = client.post("/billing/export/", {"team": "alpha", "format": "csv"})
    assert download.status_code == 200
    body = b"".join(download.streaming_content).decode()  # type: ignore[attr-defined]
    assert "alpha" in body and ",beta," not in body


def test_the_launch_form_offers_only_the_teams_the_user_operates(teams: Teams) -> None:
    client = _client(teams.alpha_op)
    form = _text(client.get("/training/new/"))
    assert 'value="alpha"' in form and 'value="beta"' not in form
    refused = client.post("/training/new/", {"name": "r", "config": "{}", "team": "beta"})
    assert refused.status_code == 400 and "no team beta that you operate" in _text(refused)
    missing = client.post("/training/new/", {"name": "r", "config": "{}"})
    assert missing.status_code == 400 and "This field is required" in _text(missing)
    assert _client(teams.alpha_viewer).get("/training/new/").status_code == 403


# --- The dashboard filtered by team ---------------------------------------------------------------


def test_the_billing_dashboard_filters_by_team_and_defaults_to_the_users_teams(teams: Teams) -> None:
    admin = _client(make_user(Role.ADMIN))
    everything = _text(admin.get("/billing/"))
    assert "16.00 USD" in everything  # both teams' spend
    picked = admin.get("/billing/?team=alpha")
    assert picked.status_code == 200
    assert "6.00 USD" in _text(picked) and "16.00 USD" not in _text(picked)
    assert "team=alpha" in _text(picked)  # the figures link to alpha's rows

    own = _text(_client(teams.beta_op).get("/billing/"))
    assert "10.00 USD" in own and "16.00 USD" not in own
    assert "beta-monthly" in own and "alpha-monthly" not in own


@pytest.mark.parametrize("team", ["beta", "no-such-team", "../etc", "a" * 300])
def test_a_team_the_user_cannot_see_is_a_form_error_on_the_dashboards(teams: Teams, team: str) -> None:
    client = _client(teams.alpha_op)
    for url in ("/billing/", "/"):
        response = client.get(url, {"team": team})
        assert response.status_code == 400, url
        html = _text(response)
        assert "that you can see" in html
        assert "10.0000" not in html  # beta's spend stays hidden


def test_the_overview_spend_is_the_picked_teams(teams: Teams) -> None:
    admin = _client(make_user(Role.ADMIN))
    assert "16.00 USD" in _text(admin.get("/"))
    assert "10.00 USD" in _text(admin.get("/?team=beta"))
    assert "6.00 USD" in _text(_client(teams.alpha_op).get("/"))


# --- The team page --------------------------------------------------------------------------------


def test_the_team_page_shows_members_keys_without_secrets_budgets_limits_and_spend(teams: Teams) -> None:
    response = _client(teams.alpha_op).get("/teams/alpha/")
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    html = _text(response)
    for name in ("alpha-op", "alpha-admin", "alpha-viewer"):
        assert f'data-member="{name}"' in html
    assert "beta-op" not in html
    assert "alpha-ci" in html and teams.key.prefix in html and "60 rpm" in html
    assert teams.key_raw not in html and teams.key.key_hash not in html
    assert "120 requests per minute" in html and "50000 tokens per minute" in html
    assert 'id="spend-chart"' in html and "6.00 USD" in html
    assert "alpha-monthly" in html and "6.00 / 100.00 USD" in html
    assert 'id="member-form"' not in html  # an operator manages no members


def test_a_team_viewer_sees_the_team_page_without_money(teams: Teams) -> None:
    html = _text(_client(teams.alpha_viewer).get("/teams/alpha/"))
    assert 'data-member="alpha-op"' in html
    assert 'id="spend-chart"' not in html and "alpha-monthly" not in html


def test_a_team_admin_adds_changes_and_removes_members(teams: Teams) -> None:
    newcomer = make_user(username="newcomer")
    client = _client(teams.alpha_admin)
    added = client.post("/teams/alpha/", {"username": "newcomer", "role": "operator"})
    assert added.status_code == 302
    assert TeamMembership.objects.get(team=teams.alpha, user=newcomer).role == Role.OPERATOR
    client.post("/teams/alpha/", {"username": "newcomer", "role": "viewer"})
    assert TeamMembership.objects.get(team=teams.alpha, user=newcomer).role == Role.VIEWER
    removed = client.post("/teams/alpha/", {"remove": "newcomer"})
    assert removed.status_code == 302
    assert not TeamMembership.objects.filter(team=teams.alpha, user=newcomer).exists()


def test_the_member_form_shows_its_errors(teams: Teams) -> None:
    client = _client(teams.alpha_admin)
    response = client.post("/teams/alpha/", {"username": "nobody-here", "role": "overlord"})
    assert response.status_code == 400
    html = _text(response)
    assert "no active user nobody-here" in html and "Select a valid choice" in html
    assert client.post("/teams/alpha/", {"remove": "beta-op"}).status_code == 404  # not a member here


def test_a_team_operator_may_not_manage_members_and_another_teams_admin_sees_no_team(teams: Teams) -> None:
    refused = _client(teams.alpha_op).post("/teams/alpha/", {"username": "beta-op", "role": "admin"})
    assert refused.status_code == 403
    assert _client(teams.alpha_op).post("/teams/alpha/", {"remove": "alpha-viewer"}).status_code == 403
    assert not TeamMembership.objects.filter(team=teams.alpha, user=teams.beta_op).exists()
    assert TeamMembership.objects.filter(team=teams.alpha, user=teams.alpha_viewer).exists()
    assert _client(teams.alpha_admin).post("/teams/beta/", {"remove": "beta-op"}).status_code == 404


def test_a_platform_admin_manages_any_teams_members(teams: Teams) -> None:
    client = _client(make_user(Role.ADMIN))
    assert 'id="member-form"' in _text(client.get("/teams/beta/"))
    assert client.post("/teams/beta/", {"username": "alpha-op", "role": "viewer"}).status_code == 302
    assert TeamMembership.objects.get(team=teams.beta, user=teams.alpha_op).role == Role.VIEWER
