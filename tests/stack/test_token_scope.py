"""A token limited to workflows reaches those workflows' data and nothing else on every /api/
endpoint: lists hold its workflows' rows, another workflow's row is a 404, inputs naming another
workflow are a 400, and endpoints that hold no workflow's data refuse it (403)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from bench.mockprovider import Behaviour, MockProviderServer
from billing.models import Budget, BudgetAlert, ExportJob, UsageRecord
from decisions.models import Recommendation, ReplayStudy
from inference.adapters.base import ChatMessage, ChatRequest
from inference.batch import jobs as batch
from inference.models import BatchJob, EvalRun, EvalSet, InferenceRequest
from inference.quality import services as quality
from inference.router.entry import route
from registry.models import Deployment, Workflow
from registry.services import api_token_create
from stack.urls import router
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db
PING = ChatRequest(messages=(ChatMessage("user", "ping"),))


@pytest.fixture
def provider() -> Iterator[MockProviderServer]:
    server = MockProviderServer(Behaviour(text="ok")).start()
    yield server
    server.stop()


@dataclass
class Side:
    """One workflow and a row of each kind that belongs to it."""

    workflow: Workflow
    deployment: Deployment
    batch_job: BatchJob
    eval_set: EvalSet
    eval_run: EvalRun
    request: InferenceRequest
    budget: Budget
    alert: BudgetAlert
    export: ExportJob


def _side(owner: User, provider: MockProviderServer, capture: Any) -> Side:
    deployment = priced_deployment(provider)
    workflow = routed_workflow(owner, [deployment])
    with capture(execute=False):
        job = batch.batch_job_create(workflow=workflow, user=owner, input_jsonl='{"prompt": "x"}\n')
        eval_set = quality.eval_set_create(
            workflow=workflow,
            name="set",
            cases=[{"prompt": "q", "expected": "ok", "scorer": "exact"}],
            user=owner,
        )
        run = quality.eval_run_start(eval_set=eval_set, deployment=deployment, user=owner)
    result = route(workflow=workflow, request=PING)
    budget = Budget.objects.create(
        name=f"budget {workflow.slug}", scope=Budget.Scope.WORKFLOW, workflow=workflow, limit_amount=10
    )
    alert = BudgetAlert.objects.create(
        budget=budget,
        period_start=timezone.now() - timedelta(days=1),
        threshold_percent=50,
        spent=Decimal("5"),
        limit_amount=Decimal("10"),
        triggered_at=timezone.now(),
    )
    export = ExportJob.objects.create(created_by=owner, filters={"workflow": workflow.slug}, formats=["csv"])
    Recommendation.objects.create(
        workflow=workflow,
        from_deployment=deployment,
        to_deployment=deployment,
        policy_version=workflow.policy_versions.get(),
        summary="a proposal",
    )
    ReplayStudy.objects.create(workflow=workflow, sample_size=1, scorer="exact")
    request = InferenceRequest.objects.get(pk=result.request_id)
    return Side(workflow, deployment, job, eval_set, run, request, budget, alert, export)


@pytest.fixture
def world(
    admin_user: User,
    provider: MockProviderServer,
    django_capture_on_commit_callbacks: Any,
    settings: Any,
    tmp_path: Path,
) -> tuple[Side, Side, APIClient, APIClient]:
    """Workflows A and B with their rows; an admin's token limited to A, and one not limited."""
    settings.OBJECT_STORE_URL = f"file://{tmp_path / 'objects'}"
    a = _side(admin_user, provider, django_capture_on_commit_callbacks)
    b = _side(admin_user, provider, django_capture_on_commit_callbacks)
    Budget.objects.create(
        name="provider budget",
        scope=Budget.Scope.PROVIDER,
        provider=a.deployment.provider,
        limit_amount=10,
    )
    limited, unlimited = APIClient(), APIClient()
    _, raw = api_token_create(user=admin_user, name="limited to A", workflows=[a.workflow])
    limited.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    _, raw = api_token_create(user=admin_user, name="not limited")
    unlimited.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return a, b, limited, unlimited


def _ids(response: Any, key: str = "id") -> set[Any]:
    assert response.status_code == 200, response.content
    body = response.json()
    rows = body["results"] if isinstance(body, dict) and "results" in body else body
    return {row[key] for row in rows}


# Every /api/ list, and how to find A's and B's rows in it.
SCOPED_LISTS: dict[str, tuple[str, Any]] = {
    "workflows": ("slug", lambda s: s.workflow.slug),
    "batch-jobs": ("id", lambda s: s.batch_job.pk),
    "eval-sets": ("id", lambda s: s.eval_set.pk),
    "eval-runs": ("id", lambda s: s.eval_run.pk),
    "usage-records": (
        "id",
        lambda s: UsageRecord.objects.filter(workflow=s.workflow).values_list("pk", flat=True)[0],
    ),
    "budgets": ("id", lambda s: s.budget.pk),
    "budget-alerts": ("id", lambda s: s.alert.pk),
    "export-jobs": ("id", lambda s: s.export.pk),
    "recommendations": ("id", lambda s: Recommendation.objects.get(workflow=s.workflow).pk),
    "replay-studies": ("id", lambda s: ReplayStudy.objects.get(workflow=s.workflow).pk),
}


def test_every_api_list_holds_only_the_tokens_workflows_or_refuses_it(
    world: tuple[Side, Side, APIClient, APIClient],
) -> None:
    """Generated from the router: a list either declares how its rows belong to a workflow (and
    shows A's rows, never B's) or refuses a limited token with 403. A new endpoint is in here."""
    a, b, limited, unlimited = world
    seen = set()
    for prefix, viewset, _ in router.registry:
        if "list" not in dir(viewset):
            assert limited.get(f"/api/{prefix}/").status_code in (403, 405)
            continue
        declares = getattr(viewset, "workflow_field", None) or hasattr(viewset, "workflow_scope_queryset")
        response = limited.get(f"/api/{prefix}/")
        if not declares:
            assert response.status_code == 403, prefix
            assert "limited to workflows" in response.json()["detail"]
            assert unlimited.get(f"/api/{prefix}/").status_code == 200, prefix
            continue
        seen.add(prefix)
        key, row_of = SCOPED_LISTS[prefix]  # a new scoped list needs its line in SCOPED_LISTS
        mine, other = row_of(a), row_of(b)
        assert mine in _ids(response, key) and other not in _ids(response, key), prefix
        assert {mine, other} <= _ids(unlimited.get(f"/api/{prefix}/"), key), prefix
    assert seen == set(SCOPED_LISTS)
    # The API root and the schema hold no workflow's data either.
    assert limited.get("/api/").status_code == 403
    assert limited.get("/api/schema/").status_code == 403


def test_usage_records_are_the_tokens_workflows_rows_only(
    world: tuple[Side, Side, APIClient, APIClient],
) -> None:
    a, b, limited, _ = world
    rows = _ids(limited.get("/api/usage-records/?limit=1000"))
    assert rows == set(UsageRecord.objects.filter(workflow=a.workflow).values_list("pk", flat=True))
    assert limited.get(f"/api/usage-records/?workflow={b.workflow.slug}").json()["results"] == []
    other_row = UsageRecord.objects.filter(workflow=b.workflow).first()
    assert other_row is not None
    assert limited.get(f"/api/usage-records/{other_row.pk}/").status_code == 404


def test_another_workflows_rows_are_404_for_reads_and_writes(
    world: tuple[Side, Side, APIClient, APIClient],
) -> None:
    a, b, limited, _ = world
    slug = b.workflow.slug
    deployment = b.deployment.slug
    for method, path, body in [
        ("get", f"/api/workflows/{slug}/", None),
        ("get", f"/api/workflows/{slug}/versions/", None),
        ("patch", f"/api/workflows/{slug}/", {"description": "mine now"}),
        ("delete", f"/api/workflows/{slug}/", None),
        ("post", f"/api/workflows/{slug}/switch/", {"deployment": deployment, "reason": "take over"}),
        ("post", f"/api/workflows/{slug}/policy/", {"deployments": [deployment], "reason": "take over"}),
        ("get", f"/api/batch-jobs/{b.batch_job.pk}/", None),
        ("post", f"/api/batch-jobs/{b.batch_job.pk}/cancel/", None),
        ("get", f"/api/eval-sets/{b.eval_set.pk}/", None),
        (
            "post",
            f"/api/eval-sets/{b.eval_set.pk}/cases/",
            {"prompt": "p", "expected": "e", "scorer": "exact"},
        ),
        ("get", f"/api/eval-runs/{b.eval_run.pk}/", None),
        ("get", f"/api/budgets/{b.budget.pk}/", None),
        ("patch", f"/api/budgets/{b.budget.pk}/", {"limit_amount": "0"}),
        ("delete", f"/api/budgets/{b.budget.pk}/", None),
        ("get", f"/api/budget-alerts/{b.alert.pk}/", None),
        ("post", f"/api/budget-alerts/{b.alert.pk}/acknowledge/", None),
        ("get", f"/api/export-jobs/{b.export.pk}/", None),
    ]:
        response = getattr(limited, method)(path, body, format="json")
        assert response.status_code == 404, (method, path, response.content)
    b.workflow.refresh_from_db()
    assert b.workflow.description == "" and b.workflow.policy_versions.count() == 1
    b.batch_job.refresh_from_db()
    assert b.batch_job.state == BatchJob.State.PENDING
    assert b.eval_set.cases.count() == 1 and Budget.objects.filter(pk=b.budget.pk, limit_amount=10).exists()
    b.alert.refresh_from_db()
    assert b.alert.acknowledged_at is None
    # Its own workflow answers as usual.
    changed = limited.post(
        f"/api/workflows/{a.workflow.slug}/policy/",
        {"deployments": [a.deployment.slug], "strategy": "cheapest", "reason": "ok"},
        format="json",
    )
    assert changed.status_code == 201, changed.content
    assert limited.get(f"/api/workflows/{a.workflow.slug}/versions/").status_code == 200


def test_inputs_naming_another_workflow_are_400_and_write_nothing(
    world: tuple[Side, Side, APIClient, APIClient],
) -> None:
    a, b, limited, _ = world
    slug = b.workflow.slug
    jobs, sets, runs = BatchJob.objects.count(), EvalSet.objects.count(), EvalRun.objects.count()
    budgets, exports = Budget.objects.count(), ExportJob.objects.count()
    refused = {
        "/api/batch-jobs/": ({"workflow": slug, "input_jsonl": '{"prompt": "x"}\n'}, "workflow"),
        "/api/eval-sets/": ({"workflow": slug, "name": "mine"}, "workflow"),
        "/api/eval-runs/": ({"eval_set": b.eval_set.pk, "deployment": b.deployment.slug}, "eval_set"),
        "/api/feedback/": ({"request_id": b.request.pk, "score": 0.0}, "request_id"),
        "/api/budgets/": (
            {"name": "b2", "scope": "workflow", "workflow": slug, "limit_amount": "1", "currency": "USD"},
            "workflow",
        ),
        "/api/export-jobs/": ({"filters": {"workflow": slug}, "formats": ["csv"]}, "filters"),
    }
    for path, (body, field) in refused.items():
        response = limited.post(path, body, format="json")
        assert response.status_code == 400, (path, response.content)
        assert field in response.json(), (path, response.json())
    # Inputs that name no workflow at all: a provider's budget, a bare deployment's score.
    provider_budget = {
        "name": "b3",
        "scope": "provider",
        "provider": a.deployment.provider.slug,
        "limit_amount": "1",
        "currency": "USD",
    }
    assert limited.post("/api/budgets/", provider_budget, format="json").status_code == 400
    bare = limited.post("/api/feedback/", {"deployment": a.deployment.slug, "score": 0.0}, format="json")
    assert bare.status_code == 400 and "workflow" in bare.json()
    assert (
        limited.post("/api/export-jobs/", {"filters": {}, "formats": ["csv"]}, format="json").status_code
        == 400
    )
    assert (
        limited.post(
            "/api/workflows/",
            {"slug": "new-one", "route": {"deployments": [a.deployment.slug]}},
            format="json",
        ).status_code
        == 403
    )
    assert (BatchJob.objects.count(), EvalSet.objects.count(), EvalRun.objects.count()) == (jobs, sets, runs)
    assert (Budget.objects.count(), ExportJob.objects.count()) == (budgets, exports)
    assert not Workflow.objects.filter(slug="new-one").exists()
    # The same inputs for its own workflow are taken.
    mine = limited.post("/api/feedback/", {"request_id": a.request.pk, "score": 1.0}, format="json")
    assert mine.status_code == 201
    job = limited.post(
        "/api/batch-jobs/", {"workflow": a.workflow.slug, "input_jsonl": '{"prompt": "x"}\n'}, format="json"
    )
    assert job.status_code == 201


def test_the_usage_export_holds_one_of_the_tokens_workflows(
    world: tuple[Side, Side, APIClient, APIClient],
) -> None:
    a, b, limited, unlimited = world
    assert limited.get("/api/usage-export/?format=jsonl").status_code == 400
    other = limited.get(f"/api/usage-export/?format=jsonl&workflow={b.workflow.slug}")
    assert other.status_code == 400 and "workflow" in other.json()
    own = limited.get(f"/api/usage-export/?format=jsonl&workflow={a.workflow.slug}")
    assert own.status_code == 200
    lines = [json.loads(x) for x in b"".join(own.streaming_content).decode().splitlines() if x]
    assert lines and {line["x_IdempotencyKey"].split(":")[1] for line in lines} == {str(a.request.pk)}
    assert unlimited.get("/api/usage-export/?format=jsonl").status_code == 200
