"""Team trust (issue 25, findings 1 and 3): a caller acts in each team with the role it holds in
that team, never the union of its teams' roles, on /v1, the API and the pages alike.

Two teams and a loopback provider. Every call to alpha's workflow costs exactly 9.87 USD and
every call to beta's 2.50 USD, so a money figure of alpha's shows on a page or in an answer as
"9.87" (or "19.74" for two calls): the mixed-role user (viewer in alpha, operator in beta) must
find neither anywhere, while beta's money is its own to see."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from bench.mockprovider import MockProviderServer
from billing.models import UsageRecord
from inference.models import BatchJob, EvalRun, EvalSet
from registry.auth.principal import principal_of_user
from registry.auth.roles import Role
from registry.models import Team, TeamMembership, Workflow
from registry.services import api_token_create
from tests.factories import api_client, make_member, make_team, make_user, make_workflow
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment
from training.models import TrainingRun

pytestmark = pytest.mark.django_db(transaction=True)
Start = Callable[..., MockProviderServer]

# The loopback provider reports 7 prompt and 3 completion tokens per call.
ALPHA_IN_PRICE = Decimal("1410000")  # 7 x 1.41 = 9.87 USD a call
BETA_PRICE = Decimal("250000")  # 7 x 0.25 + 3 x 0.25 = 2.50 USD a call
ALPHA_MONEY = ("9.87", "19.74")


def _ask(raw: str, workflow: str) -> Any:
    body = json.dumps({"model": workflow, "messages": [{"role": "user", "content": "ping"}]})
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
        "/v1/chat/completions", body, content_type="application/json"
    )


def _models(raw: str) -> set[str]:
    answer = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").get("/v1/models")
    assert answer.status_code == 200
    return {row["id"] for row in answer.json()["data"]}


@pytest.fixture
def stage(mock_provider: Start) -> dict[str, Any]:
    owner = make_user(Role.ADMIN, username="platform-admin")
    alpha, beta = make_team("alpha"), make_team("beta")
    server = mock_provider(text="ok")
    wf_alpha = make_workflow(
        owner=owner,
        slug="wf-alpha",
        team=alpha,
        deployments=[priced_deployment(server, in_price=ALPHA_IN_PRICE, out_price=Decimal("0"))],
    )
    wf_beta = make_workflow(
        owner=owner,
        slug="wf-beta",
        team=beta,
        deployments=[priced_deployment(server, in_price=BETA_PRICE, out_price=BETA_PRICE)],
    )
    wf_platform = make_workflow(
        owner=owner, slug="wf-platform", deployments=[priced_deployment(server, in_price=BETA_PRICE)]
    )
    mixed = make_user(username="mixed")
    make_member(alpha, Role.VIEWER, user=mixed)
    make_member(beta, Role.OPERATOR, user=mixed)
    alpha_admin = make_member(alpha, Role.ADMIN)
    alpha_operator = make_member(alpha, Role.OPERATOR)
    return {
        "alpha": alpha,
        "beta": beta,
        "wf_alpha": wf_alpha,
        "wf_beta": wf_beta,
        "wf_platform": wf_platform,
        "mixed": mixed,
        "alpha_admin": alpha_admin,
        "alpha_operator": alpha_operator,
    }


# --- Finding 1: /v1 asks the caller's current role in the workflow's team ---------------------


def test_a_member_removed_from_a_team_loses_its_team_key_on_v1_at_once(stage: dict[str, Any]) -> None:
    alpha, mixed = stage["alpha"], stage["mixed"]
    token, raw = api_token_create(user=mixed, name="alpha-key", team=alpha)
    assert _ask(raw, "wf-alpha").status_code == 200
    assert "wf-alpha" in _models(raw)
    ledger_settled()
    billed = UsageRecord.objects.filter(api_key=token).count()

    admin = api_client(stage["alpha_admin"], team=alpha)
    assert admin.delete("/api/teams/alpha/members/mixed/").status_code == 204

    # Its role in beta does not carry over to alpha's key (a key of no role anywhere: 403).
    assert _ask(raw, "wf-alpha").status_code == 403
    assert _models(raw) == set()
    ledger_settled()
    assert UsageRecord.objects.filter(api_key=token).count() == billed  # nothing billed since


def test_a_global_viewer_turned_beta_only_viewer_keeps_nothing_on_its_teamless_key(
    stage: dict[str, Any],
) -> None:
    user = make_user(Role.VIEWER)
    _, raw = api_token_create(user=user, name="platform-key")
    for slug in ("wf-alpha", "wf-beta", "wf-platform"):
        assert _ask(raw, slug).status_code == 200

    user.groups.remove(Group.objects.get(name=Role.VIEWER.value))
    make_member(stage["beta"], Role.VIEWER, user=user)

    # A key with no team acts with its user's global roles only: none are left.
    for slug in ("wf-alpha", "wf-beta", "wf-platform"):
        assert _ask(raw, slug).status_code == 403, slug
    assert _models(raw) == set()


def test_a_legacy_teamless_key_gains_nothing_when_its_user_joins_a_team(stage: dict[str, Any]) -> None:
    user = make_user()
    token, raw = api_token_create(user=user, name="legacy")
    assert token.team_id is None
    assert _ask(raw, "wf-beta").status_code == 403

    admin = api_client(stage["alpha_admin"], team=stage["alpha"])
    answer = admin.post("/api/teams/alpha/members/", {"user": user.username, "role": "viewer"}, format="json")
    assert answer.status_code in (200, 201), answer.content

    for slug in ("wf-alpha", "wf-beta"):
        assert _ask(raw, slug).status_code == 403, slug


def test_the_principal_answers_with_the_role_held_in_each_team(stage: dict[str, Any]) -> None:
    principal = principal_of_user(User.objects.get(pk=stage["mixed"].pk))
    alpha, beta = stage["alpha"].pk, stage["beta"].pk
    assert principal.roles_in(alpha) == {Role.VIEWER}
    assert principal.roles_in(beta) == {Role.OPERATOR}
    assert not principal.sees_costs(alpha) and principal.sees_costs(beta)
    assert principal.teams_with(frozenset({Role.OPERATOR})) == {beta}
    assert principal.visible_teams == {alpha, beta}
    assert principal.roles_in(None) == frozenset()  # no global role: no platform object to change


# --- Finding 3: money per team on /v1, the API and the pages ------------------------------------


def _spend(stage: dict[str, Any]) -> None:
    """Two billed calls on alpha's workflow (by alpha's operator) and one on beta's."""
    _, alpha_raw = api_token_create(user=stage["alpha_operator"], name="alpha-op", team=stage["alpha"])
    assert _ask(alpha_raw, "wf-alpha").status_code == 200
    assert _ask(alpha_raw, "wf-alpha").status_code == 200
    _, beta_raw = api_token_create(user=stage["mixed"], name="beta-op", team=stage["beta"])
    assert _ask(beta_raw, "wf-beta").status_code == 200
    ledger_settled()
    alpha_rows = UsageRecord.objects.filter(team="alpha")
    assert sum(r.amount for r in alpha_rows) == Decimal("19.74")


def test_v1_sends_the_cost_only_to_a_ledger_reader_of_the_workflows_team(stage: dict[str, Any]) -> None:
    mixed = stage["mixed"]
    _, alpha_raw = api_token_create(user=mixed, name="alpha", team=stage["alpha"])
    _, beta_raw = api_token_create(user=mixed, name="beta", team=stage["beta"])
    alpha_answer = _ask(alpha_raw, "wf-alpha")
    assert alpha_answer.status_code == 200
    assert "x-switchyard-cost" not in alpha_answer.headers  # a viewer in alpha
    beta_answer = _ask(beta_raw, "wf-beta")
    assert beta_answer.headers["x-switchyard-cost"] == "2.500000000"  # an operator in beta


def _eval_run(workflow: Workflow, cost: str) -> EvalRun:
    eval_set = EvalSet.objects.create(workflow=workflow, name=f"set-{workflow.slug}")
    deployment = workflow.policy_versions.first().deployments.first()  # type: ignore[union-attr]
    return EvalRun.objects.create(eval_set=eval_set, deployment=deployment, cost=Decimal(cost))


def test_the_api_shows_an_objects_money_only_to_ledger_readers_of_its_team(stage: dict[str, Any]) -> None:
    runs = {slug: _eval_run(stage[key], "9.87") for key, slug in (("wf_alpha", "a"), ("wf_beta", "b"))}
    jobs = {
        slug: BatchJob.objects.create(
            workflow=stage[key], input_uri=f"x/{slug}.jsonl", cost=Decimal("9.87"), created_by=stage["mixed"]
        )
        for key, slug in (("wf_alpha", "a"), ("wf_beta", "b"))
    }
    client = Client()
    client.force_login(stage["mixed"])
    for base, rows in (("/api/eval-runs/", runs), ("/api/batch-jobs/", jobs)):
        alpha = client.get(f"{base}{rows['a'].pk}/")
        assert alpha.status_code == 200 and "cost" not in alpha.json(), base
        beta = client.get(f"{base}{rows['b'].pk}/")
        assert beta.status_code == 200 and Decimal(beta.json()["cost"]) == Decimal("9.87"), base
        listed = client.get(base).json()
        by_id = {row["id"]: row for row in listed.get("results", listed)}
        assert "cost" not in by_id[rows["a"].pk] and "cost" in by_id[rows["b"].pk], base


def test_pages_and_exports_hold_no_money_of_a_team_where_the_caller_is_a_viewer(
    stage: dict[str, Any],
) -> None:
    _spend(stage)
    client = Client()
    client.force_login(stage["mixed"])
    ledger = client.get("/billing/ledger/")
    assert ledger.status_code == 200
    body = ledger.content.decode()
    # Beta's rows (its unit price 250000) are there; none of alpha's (9.87 a call, 1410000 a 1M).
    assert "250000.0" in body and not any(figure in body for figure in ("9.87", "1410000")), body
    refused = client.post(
        "/billing/export/", {"team": "alpha", "format": "csv", "start": "2020-01-01", "end": "2100-01-01"}
    )
    assert refused.status_code == 400
    assert b"9.87" not in refused.content
    # The API answers the same.
    assert client.get("/api/usage-records/?team=alpha").status_code in (200, 400)
    rows = client.get("/api/usage-records/").json()
    assert {row["team"] for row in rows.get("results", rows)} == {"beta"}


def _no_arg_get_urls() -> list[str]:
    """Every URL of the project that takes no argument (pages and API lists alike)."""
    found: list[str] = []

    def walk(patterns: list[Any], prefix: str) -> None:
        for pattern in patterns:
            route = str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, prefix + route)
            elif isinstance(pattern, URLPattern) and "<" not in route and "(?P" not in route:
                path = "/" + (prefix + route).lstrip("^").rstrip("$").replace("\\", "")
                if "^" not in path and "$" not in path and "(" not in path:
                    found.append(path)

    walk(get_resolver().url_patterns, "")
    skip = ("/logout", "/v1/", "/oidc/", "/admin/", "/static/", "/metrics", "/health", "/api/schema")
    return sorted({u for u in found if not u.startswith(skip)})


def test_no_page_and_no_api_list_shows_alphas_money_to_its_viewer(stage: dict[str, Any]) -> None:
    """The walk: every argument-free page and /api/ list, as the mixed-role user, holds no money
    figure of alpha's; and the workflows it lists are those the API lists."""
    _spend(stage)
    runs = {key: _eval_run(stage[key], "9.87") for key in ("wf_alpha", "wf_beta")}
    client = Client()
    client.force_login(stage["mixed"])
    walked = 0
    for url in _no_arg_get_urls():
        answer = client.get(url)
        if answer.status_code != 200 or answer.get("Content-Type", "").startswith(
            ("application/javascript", "image/")
        ):
            continue
        raw = b"".join(answer.streaming_content) if answer.streaming else answer.content  # type: ignore[attr-defined]
        body = raw.decode(errors="replace")
        walked += 1
        for figure in ALPHA_MONEY:
            assert figure not in body, f"{url} shows alpha's money {figure}"
    assert walked > 20
    detail = client.get(f"/api/eval-runs/{runs['wf_beta'].pk}/").json()
    assert Decimal(detail["cost"]) == Decimal("9.87")  # beta's money is its own
    api_slugs = {row["slug"] for row in client.get("/api/workflows/").json()["results"]}
    assert api_slugs == {"wf-alpha", "wf-beta"}
    inference_page = client.get("/inference/").content.decode()
    assert all(slug in inference_page for slug in api_slugs) and "wf-platform" not in inference_page


def test_build_or_buy_figures_are_refused_to_a_viewer_of_the_runs_team(stage: dict[str, Any]) -> None:
    run = TrainingRun.objects.create(name="alpha-run", team=stage["alpha"], config={"build_or_buy": True})
    client = Client()
    client.force_login(stage["mixed"])
    answer = client.get(f"/api/decisions/training-runs/{run.pk}/build-or-buy/")
    assert answer.status_code in (403, 404)
    assert TeamMembership.objects.filter(team=stage["alpha"], user=stage["mixed"]).exists()
    assert Team.objects.count() == 2
