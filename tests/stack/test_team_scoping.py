"""Every /api/ endpoint keeps a team-scoped caller to its teams: another team's row answers 404,
lists hold none of it, and inputs naming another team are refused (registry.auth.teams).

Team B's objects all carry the marker "bravo" in their names, so the probe at the end can read
every list the API offers and look for it.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone
from rest_framework.response import Response
from rest_framework.test import APIClient, APIRequestFactory, force_authenticate
from rest_framework.views import APIView

from billing.exports.filters import ExportFilters
from billing.exports.jobs import export_job_create
from billing.models import Budget, BudgetAlert, ExportJob, Unit, UsageRecord
from billing.services import usage_record
from inference.models import BatchJob, EvalRun, EvalSet
from registry.auth.roles import Role
from registry.auth.scoping import TEAM_SCOPED_MESSAGE, view_team_rule
from registry.models import Cluster, FailoverEvent, Team, Workflow
from registry.services import api_token_create
from tests.factories import (
    api_client,
    make_cluster,
    make_deployment,
    make_member,
    make_model,
    make_team,
    make_user,
    make_workflow,
    tiny_run_config,
)
from training.models import ModelVersion, TrainingRun

MARKER = "bravo"


@dataclass
class Side:
    """One team's objects."""

    team: Team
    workflow: Workflow
    batch_job: BatchJob
    eval_set: EvalSet
    eval_run: EvalRun
    run: TrainingRun
    usage: UsageRecord
    run_usage: UsageRecord
    workflow_budget: Budget
    team_budget: Budget
    run_budget: Budget
    alert: BudgetAlert
    export_job: ExportJob
    inference_failover: FailoverEvent
    training_failover: FailoverEvent


def _side(slug: str, *, owner: User, cluster: Cluster) -> Side:
    team = make_team(slug)
    deployment = make_deployment()
    workflow = make_workflow(
        owner=owner, slug=f"{slug}-wf", team=team, deployments=[deployment, make_deployment()]
    )
    now = timezone.now()
    run = TrainingRun.objects.create(name=f"{slug}-run", config={"team": slug}, team=team)
    usage = usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal("1"),
        occurred_at=now - timedelta(hours=1),
        idempotency_key=f"{slug}-served",
        subject_type="test",
        subject_id=f"{slug}-1",
        cluster=cluster,
        workflow=workflow,
        description=f"{slug} work",
    )
    run_usage = usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal("2"),
        occurred_at=now - timedelta(hours=1),
        idempotency_key=f"{slug}-chunk",
        subject_type="training_run",
        subject_id=str(run.pk),
        cluster=cluster,
        team=slug,
        description=f"{slug} chunk",
    )
    budgets = [
        Budget.objects.create(name=f"{slug}-{scope}", scope=scope, limit_amount=Decimal("100"), **target)
        for scope, target in (
            (Budget.Scope.WORKFLOW, {"workflow": workflow}),
            (Budget.Scope.TEAM, {"team": slug}),
            (Budget.Scope.TRAINING_RUN, {"training_run_id": str(run.pk)}),
        )
    ]
    alert = BudgetAlert.objects.create(
        budget=budgets[1],
        period_start=now - timedelta(days=1),
        threshold_percent=50,
        spent=Decimal("50"),
        limit_amount=Decimal("100"),
        triggered_at=now,
    )
    return Side(
        team=team,
        workflow=workflow,
        batch_job=BatchJob.objects.create(workflow=workflow, input_uri=f"in/{slug}.jsonl", created_by=owner),
        eval_set=(eval_set := EvalSet.objects.create(workflow=workflow, name=f"{slug}-evals")),
        eval_run=EvalRun.objects.create(eval_set=eval_set, deployment=deployment),
        run=run,
        usage=usage,
        run_usage=run_usage,
        workflow_budget=budgets[0],
        team_budget=budgets[1],
        run_budget=budgets[2],
        alert=alert,
        export_job=export_job_create(
            created_by=owner, filters=ExportFilters(team=slug).for_teams([slug]), formats=["csv"]
        ),
        inference_failover=FailoverEvent.objects.create(
            kind=FailoverEvent.Kind.INFERENCE,
            reason=f"{slug}: the primary answered 503",
            detected_at=now,
            from_deployment=deployment,
            details={"workflow": workflow.slug},
        ),
        training_failover=FailoverEvent.objects.create(
            kind=FailoverEvent.Kind.TRAINING,
            reason=f"{slug} learner lost",
            detected_at=now,
            subject=f"training-run:{run.pk}/learner:0",
            training_run_id=run.pk,
        ),
    )


@pytest.fixture
def world(db: Any, settings: Any, tmp_path: Any) -> dict[str, Any]:
    settings.OBJECT_STORE_URL = f"file://{tmp_path}/objects"
    platform = make_user(Role.ADMIN, username="platform-admin")
    cluster = make_cluster()
    alpha = _side("alpha", owner=platform, cluster=cluster)
    bravo = _side(MARKER, owner=platform, cluster=cluster)
    # The platform's own: a cluster's health event and a provider budget.
    health = FailoverEvent.objects.create(
        kind=FailoverEvent.Kind.CLUSTER_HEALTH,
        from_cluster=cluster,
        reason="silent",
        detected_at=timezone.now(),
    )
    provider_budget = Budget.objects.create(
        name="platform-provider",
        scope=Budget.Scope.PROVIDER,
        provider=cluster.provider,
        limit_amount=Decimal("9"),
    )
    export_job_create(created_by=platform, filters=ExportFilters(), formats=["csv"])  # every row
    return {
        "alpha": alpha,
        "bravo": bravo,
        "cluster": cluster,
        "health": health,
        "provider_budget": provider_budget,
        "operator": make_member(alpha.team, Role.OPERATOR, user=make_user(username="alpha-operator")),
        "viewer": make_member(alpha.team, Role.VIEWER, user=make_user(username="alpha-viewer")),
        "admin": make_member(alpha.team, Role.ADMIN, user=make_user(username="alpha-admin")),
    }


# Each team-owned object as the API addresses it: (name, URL of a side's object).
OBJECT_URLS: list[tuple[str, Any]] = [
    ("workflow", lambda s: f"/api/workflows/{s.workflow.slug}/"),
    ("workflow versions", lambda s: f"/api/workflows/{s.workflow.slug}/versions/"),
    ("batch job", lambda s: f"/api/batch-jobs/{s.batch_job.pk}/"),
    ("eval set", lambda s: f"/api/eval-sets/{s.eval_set.pk}/"),
    ("eval run", lambda s: f"/api/eval-runs/{s.eval_run.pk}/"),
    ("training run", lambda s: f"/api/training-runs/{s.run.pk}/"),
    ("training run metrics", lambda s: f"/api/training-runs/{s.run.pk}/metrics/"),
    ("usage row", lambda s: f"/api/usage-records/{s.usage.pk}/"),
    ("training chunk's usage row", lambda s: f"/api/usage-records/{s.run_usage.pk}/"),
    ("workflow budget", lambda s: f"/api/budgets/{s.workflow_budget.pk}/"),
    ("team budget", lambda s: f"/api/budgets/{s.team_budget.pk}/"),
    ("training run budget", lambda s: f"/api/budgets/{s.run_budget.pk}/"),
    ("budget alert", lambda s: f"/api/budget-alerts/{s.alert.pk}/"),
    ("export job", lambda s: f"/api/export-jobs/{s.export_job.pk}/"),
    ("inference failover", lambda s: f"/api/failover-events/{s.inference_failover.pk}/"),
    ("training failover", lambda s: f"/api/failover-events/{s.training_failover.pk}/"),
    ("team", lambda s: f"/api/teams/{s.team.slug}/"),
    ("team members", lambda s: f"/api/teams/{s.team.slug}/members/"),
]


@pytest.mark.parametrize(("what", "url"), OBJECT_URLS, ids=[w for w, _ in OBJECT_URLS])
def test_a_team_a_member_reads_its_own_object_and_gets_404_on_team_bs(
    world: dict[str, Any], what: str, url: Any
) -> None:
    # A team admin holds operator and auditor in its team: it may read every one of these.
    client = api_client(world["admin"])
    assert client.get(url(world["alpha"])).status_code == 200
    assert client.get(url(world["bravo"])).status_code == 404


def test_a_team_a_operator_gets_404_on_team_bs_workflow_batch_job_run_and_usage_rows(
    world: dict[str, Any],
) -> None:
    """The issue's words: team B's workflow, batch job, run and usage rows do not exist for A."""
    client, bravo = api_client(world["operator"]), world["bravo"]
    for url in (
        f"/api/workflows/{bravo.workflow.slug}/",
        f"/api/batch-jobs/{bravo.batch_job.pk}/",
        f"/api/training-runs/{bravo.run.pk}/",
        f"/api/usage-records/{bravo.usage.pk}/",
    ):
        assert client.get(url).status_code == 404, url
    # Changing them is a 404 too, never a 403 that would tell they exist.
    assert client.patch(f"/api/workflows/{bravo.workflow.slug}/", {"description": "x"}).status_code == 404
    assert client.post(f"/api/batch-jobs/{bravo.batch_job.pk}/cancel/").status_code == 404
    assert client.post(f"/api/training-runs/{bravo.run.pk}/cancel/", {}).status_code == 404
    assert client.post(f"/api/eval-sets/{bravo.eval_set.pk}/cases/", {"prompt": "x"}).status_code == 404
    assert client.post(f"/api/budget-alerts/{bravo.alert.pk}/acknowledge/").status_code == 404
    bravo.batch_job.refresh_from_db()
    assert bravo.batch_job.state == BatchJob.State.PENDING


def _ids(response: Any, key: str = "id") -> set[Any]:
    assert response.status_code == 200, response.content
    body = response.json()
    rows = body["results"] if isinstance(body, dict) and "results" in body else body
    return {row[key] for row in rows}


def test_lists_hold_team_as_rows_only(world: dict[str, Any]) -> None:
    client, alpha = api_client(world["admin"]), world["alpha"]
    assert _ids(client.get("/api/workflows/"), "slug") == {alpha.workflow.slug}
    assert _ids(client.get("/api/batch-jobs/")) == {alpha.batch_job.pk}
    assert _ids(client.get("/api/eval-sets/")) == {alpha.eval_set.pk}
    assert _ids(client.get("/api/eval-runs/")) == {alpha.eval_run.pk}
    assert _ids(client.get("/api/training-runs/")) == {alpha.run.pk}
    assert _ids(client.get("/api/usage-records/")) == {alpha.usage.pk, alpha.run_usage.pk}
    assert _ids(client.get("/api/budgets/")) == {
        alpha.workflow_budget.pk,
        alpha.team_budget.pk,
        alpha.run_budget.pk,
    }  # not the provider's budget: it spans every team's spend
    assert _ids(client.get("/api/budget-alerts/")) == {alpha.alert.pk}
    assert _ids(client.get("/api/export-jobs/")) == {alpha.export_job.pk}
    assert _ids(client.get("/api/failover-events/")) == {
        alpha.inference_failover.pk,
        alpha.training_failover.pk,
    }  # not the cluster's health event: the platform's
    assert _ids(client.get("/api/teams/"), "slug") == {"alpha"}


def test_a_platform_admin_still_sees_every_team(world: dict[str, Any]) -> None:
    client = api_client(User.objects.get(username="platform-admin"))
    assert len(_ids(client.get("/api/workflows/"), "slug")) == 2
    assert len(_ids(client.get("/api/budgets/"))) == 7
    assert len(_ids(client.get("/api/failover-events/"))) == 5
    assert _ids(client.get("/api/teams/"), "slug") == {"alpha", MARKER}


def test_a_team_viewer_reads_its_workflow_but_gets_403_changing_it(world: dict[str, Any]) -> None:
    client, alpha = api_client(world["viewer"]), world["alpha"]
    assert client.get(f"/api/workflows/{alpha.workflow.slug}/").status_code == 200
    response = client.patch(
        f"/api/workflows/{alpha.workflow.slug}/", {"description": "changed"}, format="json"
    )
    assert response.status_code == 403
    alpha.workflow.refresh_from_db()
    assert alpha.workflow.description == ""
    # A viewer reads no money, in its own team either.
    assert client.get("/api/usage-records/").status_code == 403


def test_a_viewer_of_one_team_reads_no_ledger_rows_of_it_as_an_operator_of_another(
    world: dict[str, Any],
) -> None:
    user = world["operator"]
    make_member(world["bravo"].team, Role.VIEWER, user=user)
    client = api_client(user)
    # Workflows: any role reads them, so both teams' show.
    assert len(_ids(client.get("/api/workflows/"), "slug")) == 2
    # The ledger: only where the caller's role there is a ledger reader's.
    assert _ids(client.get("/api/usage-records/")) == {world["alpha"].usage.pk, world["alpha"].run_usage.pk}
    assert client.get(f"/api/usage-records/{world['bravo'].usage.pk}/").status_code == 404


def _create_workflow(client: APIClient, deployment_slug: str, **extra: Any) -> Any:
    body = {"slug": "new-wf", "route": {"deployments": [deployment_slug]}, **extra}
    return client.post("/api/workflows/", body, format="json")


def test_a_team_a_operator_cannot_create_a_workflow_budget_or_run_in_team_b(world: dict[str, Any]) -> None:
    client, alpha, bravo = api_client(world["operator"]), world["alpha"], world["bravo"]
    deployment = make_deployment()

    refused = _create_workflow(client, deployment.slug, team=MARKER)
    assert refused.status_code == 400 and "team" in refused.json()
    unnamed = _create_workflow(client, deployment.slug)
    assert unnamed.status_code == 400 and unnamed.json()["team"] == ["Name one of your teams"]
    moved = client.patch(f"/api/workflows/{alpha.workflow.slug}/", {"team": MARKER}, format="json")
    assert moved.status_code == 400 and "team" in moved.json()

    for body, field in (
        ({"scope": "team", "team": MARKER}, "team"),
        ({"scope": "workflow", "workflow": bravo.workflow.slug}, "workflow"),
        ({"scope": "training_run", "training_run_id": str(bravo.run.pk)}, "training_run_id"),
        ({"scope": "provider", "provider": world["cluster"].provider.slug}, "scope"),
        ({"scope": "cluster", "cluster": world["cluster"].slug}, "scope"),
    ):
        response = client.post("/api/budgets/", {"name": "b", "limit_amount": "5", **body}, format="json")
        assert response.status_code == 400 and field in response.json(), (body, response.json())
    changed = client.patch(f"/api/budgets/{alpha.team_budget.pk}/", {"team": MARKER}, format="json")
    assert changed.status_code == 400 and "team" in changed.json()

    for config, field in ((tiny_run_config(team=MARKER), "team"), (tiny_run_config(), "team")):
        response = client.post("/api/training-runs/", {"name": "r", "config": config}, format="json")
        assert response.status_code == 400 and field in response.json(), response.json()

    assert set(Workflow.objects.values_list("slug", flat=True)) == {alpha.workflow.slug, bravo.workflow.slug}
    assert not Budget.objects.filter(name="b").exists()
    assert TrainingRun.objects.count() == 2


def test_a_team_a_operator_creates_its_teams_workflow_budget_and_run(
    world: dict[str, Any], settings: Any, tmp_path: Any
) -> None:
    client, alpha = api_client(world["operator"]), world["alpha"]
    created = _create_workflow(client, make_deployment().slug, team="alpha")
    assert created.status_code == 201, created.json()
    assert Workflow.objects.get(slug="new-wf").team == alpha.team
    budget = client.post(
        "/api/budgets/", {"name": "b", "scope": "team", "team": "alpha", "limit_amount": "5"}, format="json"
    )
    assert budget.status_code == 201, budget.json()
    run = client.post(
        "/api/training-runs/", {"name": "r", "config": tiny_run_config(team="alpha")}, format="json"
    )
    assert run.status_code == 201, run.json()
    assert run.json()["team"] == "alpha"
    assert TrainingRun.objects.get(pk=run.json()["id"]).team == alpha.team


def test_a_team_budget_must_name_a_team_that_exists(admin_user: User) -> None:
    response = api_client(admin_user).post(
        "/api/budgets/", {"name": "b", "scope": "team", "team": "nobody", "limit_amount": "5"}, format="json"
    )
    assert response.status_code == 400
    assert response.json() == {"team": ["no team nobody"]}


def test_feedback_from_a_team_member_names_one_of_its_workflows(world: dict[str, Any]) -> None:
    client, alpha = api_client(world["operator"]), world["alpha"]
    deployment = alpha.workflow.policy_versions.get().ordered_deployments()[0]
    bare = client.post("/api/feedback/", {"deployment": deployment.slug, "score": 0.5}, format="json")
    assert bare.status_code == 400 and "workflow" in bare.json()
    other = client.post(
        "/api/feedback/",
        {"deployment": deployment.slug, "workflow": world["bravo"].workflow.slug, "score": 0.5},
        format="json",
    )
    assert other.status_code == 400 and "workflow" in other.json()
    own = client.post(
        "/api/feedback/",
        {"deployment": deployment.slug, "workflow": alpha.workflow.slug, "score": 0.5},
        format="json",
    )
    assert own.status_code == 201, own.json()


def test_team_members_read_clusters_and_providers_but_cannot_change_them(world: dict[str, Any]) -> None:
    cluster = world["cluster"]
    client = api_client(world["admin"])  # even the team's admin: shared objects are the platform's
    assert client.get("/api/clusters/").status_code == 200
    assert client.get(f"/api/clusters/{cluster.slug}/").status_code == 200
    assert client.get(f"/api/providers/{cluster.provider.slug}/").status_code == 200
    assert client.get("/api/price-books/").status_code == 200
    for method, url, body in (
        ("patch", f"/api/clusters/{cluster.slug}/", {"capacity": 9}),
        ("post", f"/api/clusters/{cluster.slug}/drain/", {}),
        ("post", "/api/providers/", {"slug": "p", "display_name": "P", "kind": "aws"}),
        ("patch", f"/api/providers/{cluster.provider.slug}/", {"display_name": "mine"}),
        ("post", "/api/probe-jobs/", {"cluster": cluster.slug, "steps": 5}),
        ("put", f"/api/chaos/{make_deployment().slug}/", {"enabled": True}),
    ):
        response = getattr(client, method)(url, body, format="json")
        assert response.status_code == 403, (method, url, response.status_code)
    refused = client.patch(f"/api/clusters/{cluster.slug}/", {"capacity": 9}, format="json")
    assert refused.json()["detail"] == TEAM_SCOPED_MESSAGE
    before = (cluster.capacity, cluster.status)
    cluster.refresh_from_db()
    assert (cluster.capacity, cluster.status) == before


def test_the_audit_trail_and_reconciliation_are_for_platform_roles_only(world: dict[str, Any]) -> None:
    client = api_client(world["admin"])
    assert client.get("/api/audit/").status_code == 403
    assert client.get("/api/invoice-imports/").status_code == 403


def test_a_team_key_reaches_its_team_only(world: dict[str, Any]) -> None:
    user = world["operator"]
    make_member(world["bravo"].team, Role.OPERATOR, user=user)
    _, raw = api_token_create(user=user, name="alpha key", team=world["alpha"].team)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert _ids(client.get("/api/workflows/"), "slug") == {world["alpha"].workflow.slug}
    assert client.get(f"/api/workflows/{world['bravo'].workflow.slug}/").status_code == 404


# --- The usage export ----------------------------------------------------------------------


def _export_rows(response: Any, fmt: str) -> list[dict[str, Any]]:
    assert response.status_code == 200, response
    text = b"".join(response.streaming_content).decode()
    if fmt == "jsonl":
        return [json.loads(line) for line in text.splitlines() if line]
    return list(csv.DictReader(io.StringIO(text)))


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])  # csv: PostgreSQL's COPY; jsonl: the Python rows
def test_the_usage_export_holds_the_callers_teams_rows_only(world: dict[str, Any], fmt: str) -> None:
    alpha = world["alpha"]
    client = api_client(world["admin"])
    rows = _export_rows(client.get(f"/api/usage-export/?format={fmt}"), fmt)
    assert {int(r["x_UsageRecordId"]) for r in rows} == {alpha.usage.pk, alpha.run_usage.pk}
    named = client.get(f"/api/usage-export/?format={fmt}&team=alpha")
    assert {int(r["x_UsageRecordId"]) for r in _export_rows(named, fmt)} == {
        alpha.usage.pk,
        alpha.run_usage.pk,
    }
    platform = api_client(User.objects.get(username="platform-admin"))
    assert len(_export_rows(platform.get(f"/api/usage-export/?format={fmt}"), fmt)) == 4


def test_the_usage_export_refuses_another_teams_filters(world: dict[str, Any]) -> None:
    client = api_client(world["admin"])
    response = client.get(f"/api/usage-export/?team={MARKER}")
    assert response.status_code == 400 and response.json() == {"team": [f"no team {MARKER}"]}
    response = client.get(f"/api/usage-export/?workflow={world['bravo'].workflow.slug}")
    assert response.status_code == 400 and "workflow" in response.json()
    job = client.post("/api/export-jobs/", {"filters": {"team": MARKER}, "formats": ["csv"]}, format="json")
    assert job.status_code == 400 and "team" in job.json()["filters"]


def test_an_export_job_of_a_team_member_holds_its_teams_rows_only(world: dict[str, Any]) -> None:
    client = api_client(world["admin"])
    response = client.post("/api/export-jobs/", {"formats": ["jsonl"]}, format="json")
    assert response.status_code == 201, response.json()
    job = ExportJob.objects.get(pk=response.json()["id"])
    assert job.filters["teams"] == ["alpha"]
    # The job runs as it was scoped: its rows are team A's.
    from billing.exports.filters import export_queryset

    rows = export_queryset(filters=ExportFilters.from_json(job.filters))
    assert set(rows.values_list("pk", flat=True)) == {world["alpha"].usage.pk, world["alpha"].run_usage.pk}
    assert client.get(f"/api/export-jobs/{job.pk}/").status_code == 200


# --- Fail closed: every route says how its rows belong to teams --------------------------------


def _api_views() -> list[tuple[str, Any]]:
    found: dict[str, Any] = {}

    def walk(patterns: list[Any], prefix: str) -> None:
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
            elif isinstance(pattern, URLPattern) and route.startswith("api/"):
                view = getattr(pattern.callback, "cls", None)
                if view is not None and pattern.name:
                    found.setdefault(pattern.name, view)

    walk(get_resolver().url_patterns, "")
    return sorted(found.items())


API_VIEWS = _api_views()


def test_the_walk_finds_every_api_route() -> None:
    names = {name for name, _ in API_VIEWS}
    assert {"workflow-list", "usage-export", "team-members", "auditentry-list", "schema"} <= names


@pytest.mark.parametrize(("name", "view"), API_VIEWS, ids=[n for n, _ in API_VIEWS])
def test_every_api_view_declares_how_its_rows_belong_to_teams(name: str, view: Any) -> None:
    assert view_team_rule(view) is not None, (
        f"{name} ({view.__name__}) says nothing of teams: declare workflow_field, team_field, "
        "team_scope_queryset, shared_with_teams or platform_only (registry.auth.scoping)"
    )


class _Undeclared(APIView):
    """An endpoint added without a word about teams."""

    def get(self, request: Any) -> Response:
        return Response({"secret": "every team's"})


def test_a_view_that_declares_nothing_is_closed_to_team_members(db: Any) -> None:
    team_member = make_member(make_team("alpha"), Role.ADMIN)
    platform = make_user(Role.VIEWER)
    answers = {}
    for who, user in (("team", team_member), ("platform", platform)):
        request = APIRequestFactory().get("/api/undeclared/")
        force_authenticate(request, user=user)
        with transaction.atomic():  # as ATOMIC_REQUESTS wraps a routed view: a refusal rolls back
            answers[who] = _Undeclared.as_view()(request).status_code
    assert answers == {"team": 403, "platform": 200}


def _list_urls() -> list[tuple[str, str]]:
    """Every /api/ route a GET may list without naming an object."""
    urls = []
    for name, _view in API_VIEWS:
        try:
            urls.append((name, reverse(name)))
        except Exception:  # noqa: S112 (a route that names an object: covered by OBJECT_URLS)
            continue
    return urls


LIST_URLS = _list_urls()


@pytest.mark.parametrize(("name", "url"), LIST_URLS, ids=[n for n, _ in LIST_URLS])
def test_no_list_shows_a_team_a_member_any_row_of_team_b(world: dict[str, Any], name: str, url: str) -> None:
    response = api_client(world["admin"]).get(url)
    assert response.status_code in (200, 403, 405), (url, response.status_code)
    body = (
        b"".join(response.streaming_content) if getattr(response, "streaming", False) else response.content
    ).decode(errors="replace")
    assert MARKER not in body, f"{url} shows team B's rows to a member of team A"


def test_a_team_member_cannot_start_a_run_from_another_teams_model_version(world: dict[str, Any]) -> None:
    bravo_run = world["bravo"].run
    TrainingRun.objects.filter(pk=bravo_run.pk).update(config=tiny_run_config(team=MARKER))
    version = ModelVersion.objects.create(
        registered_model=make_model(),
        number=1,
        run=bravo_run,
        key="final",
        global_version=3,
        final=True,
        artifact_uri="file:///nowhere/model.pt",
        layout=ModelVersion.Layout.SWITCHYARD,
    )
    config = tiny_run_config(team="alpha", start_from={"model_version": version.pk})
    response = api_client(world["operator"]).post(
        "/api/training-runs/", {"name": "r", "config": config}, format="json"
    )
    assert response.status_code == 400
    assert list(response.json()) == ["start_from.model_version"]
    assert response.json()["start_from.model_version"][0].startswith(f"no model version {version.pk}")
    assert TrainingRun.objects.count() == 2
