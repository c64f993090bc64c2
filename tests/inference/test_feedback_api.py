"""/api/feedback/, /api/eval-sets/ and /api/eval-runs/: roles, 400s with field messages, 201s."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User

from bench.mockprovider import MockProviderServer
from inference.adapters.base import ChatMessage, ChatRequest
from inference.models import EvalCase, EvalRun, EvalSet, QualityRecord
from inference.router.entry import route
from inference.selectors import rolling_caches_clear, rolling_quality
from tests.factories import api_client
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db
Start = Callable[..., MockProviderServer]


def test_feedback_by_request_id_scores_the_deployment_that_answered(
    operator: User, mock_provider: Start
) -> None:
    deployment = priced_deployment(mock_provider())
    workflow = routed_workflow(operator, [deployment])
    result = route(workflow=workflow, request=ChatRequest(messages=(ChatMessage("user", "hi"),)))
    client = api_client(operator)

    response = client.post(
        "/api/feedback/",
        {"request_id": result.request_id, "score": 0.25, "comment": "off topic"},
        format="json",
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["deployment"], body["workflow"], body["source"]) == (
        deployment.slug,
        workflow.slug,
        "feedback",
    )
    record = QualityRecord.objects.get(pk=body["id"])
    assert record.score == Decimal("0.25") and record.inference_request_id == result.request_id
    rolling_caches_clear()
    # The router's quality floor sees it.
    assert rolling_quality(workflow_id=workflow.pk, deployment_ids=[deployment.pk]) == {deployment.pk: 0.25}


def test_feedback_by_deployment_and_workflow(operator: User) -> None:
    deployment = priced_deployment(base_url="http://127.0.0.1:9/v1")
    workflow = routed_workflow(operator, [deployment])
    response = api_client(operator).post(
        "/api/feedback/",
        {"deployment": deployment.slug, "workflow": workflow.slug, "score": "1"},
        format="json",
    )
    assert response.status_code == 201, response.json()
    record = QualityRecord.objects.get(pk=response.json()["id"])
    assert (record.deployment_id, record.workflow_id, record.score) == (
        deployment.pk,
        workflow.pk,
        Decimal("1"),
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"score": 0.5}, "deployment"),
        ({"deployment": "no-such", "score": 0.5}, "deployment"),
        ({"request_id": 999999, "score": 0.5}, "request_id"),
        ({"deployment": "DEP", "score": 1.5}, "score"),
        ({"deployment": "DEP", "score": -0.1}, "score"),
        ({"deployment": "DEP", "score": "high"}, "score"),
        ({"deployment": "DEP", "score": "NaN"}, "score"),
        ({"deployment": "DEP"}, "score"),
        ({"deployment": "DEP", "workflow": "no-such", "score": 0.5}, "workflow"),
    ],
)
def test_bad_feedback_answers_400_naming_the_field(operator: User, body: dict[str, Any], field: str) -> None:
    deployment = priced_deployment(base_url="http://127.0.0.1:9/v1")
    body = {k: (deployment.slug if v == "DEP" else v) for k, v in body.items()}
    response = api_client(operator).post("/api/feedback/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert not QualityRecord.objects.exists()


def test_feedback_needs_a_writer_role(viewer: User) -> None:
    deployment = priced_deployment(base_url="http://127.0.0.1:9/v1")
    response = api_client(viewer).post(
        "/api/feedback/", {"deployment": deployment.slug, "score": 1}, format="json"
    )
    assert response.status_code == 403
    assert not QualityRecord.objects.exists()


def test_eval_set_api_creates_sets_cases_and_runs(
    operator: User, viewer: User, django_capture_on_commit_callbacks: Any
) -> None:
    deployment = priced_deployment(base_url="http://127.0.0.1:9/v1")
    workflow = routed_workflow(operator, [deployment])
    client = api_client(operator)
    response = client.post(
        "/api/eval-sets/",
        {
            "workflow": workflow.slug,
            "name": "smoke",
            "schedule_enabled": True,
            "cases": [
                {"prompt": "2+2", "expected": "4", "scorer": "numeric", "scorer_config": {"tolerance": 0}}
            ],
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    set_id = response.json()["id"]
    assert EvalSet.objects.get(pk=set_id).schedule_enabled

    bad = client.post(
        f"/api/eval-sets/{set_id}/cases/", {"prompt": "p", "expected": "([", "scorer": "regex"}, format="json"
    )
    assert bad.status_code == 400 and "expected" in bad.json()
    bad = client.post(f"/api/eval-sets/{set_id}/cases/", {"prompt": "p", "scorer": "judge"}, format="json")
    assert bad.status_code == 400 and "judge_deployment" in bad.json()
    ok = client.post(
        f"/api/eval-sets/{set_id}/cases/",
        {"prompt": "rate", "scorer": "judge", "judge_deployment": deployment.slug},
        format="json",
    )
    assert ok.status_code == 201, ok.json()
    assert EvalCase.objects.filter(eval_set_id=set_id).count() == 2

    duplicate = client.post("/api/eval-sets/", {"workflow": workflow.slug, "name": "smoke"}, format="json")
    assert duplicate.status_code == 400 and "name" in duplicate.json()

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        run = client.post(
            "/api/eval-runs/", {"eval_set": set_id, "deployment": deployment.slug}, format="json"
        )
    assert run.status_code == 201, run.json()
    assert len(callbacks) == 1
    assert run.json()["state"] == "pending" and run.json()["cases_total"] == 2
    assert EvalRun.objects.get(pk=run.json()["id"]).created_by == operator

    reader = api_client(viewer)
    listed = reader.get(f"/api/eval-runs/?eval_set={set_id}").json()
    assert [r["id"] for r in listed["results"]] == [run.json()["id"]]
    detail = reader.get(f"/api/eval-sets/{set_id}/").json()
    assert [c["scorer"] for c in detail["cases"]] == ["numeric", "judge"]
    assert (
        reader.post(
            "/api/eval-runs/", {"eval_set": set_id, "deployment": deployment.slug}, format="json"
        ).status_code
        == 403
    )


def test_feedback_for_a_failed_request_or_the_wrong_deployment_is_refused(
    operator: User, mock_provider: Start
) -> None:
    failing = priced_deployment(mock_provider(status=500))
    other = priced_deployment(base_url="http://127.0.0.1:9/v1")
    workflow = routed_workflow(operator, [failing])
    result = route(workflow=workflow, request=ChatRequest(messages=(ChatMessage("user", "hi"),)))
    assert not result.ok
    client = api_client(operator)
    response = client.post("/api/feedback/", {"request_id": result.request_id, "score": 1}, format="json")
    assert response.status_code == 400 and "request_id" in response.json()
    response = client.post(
        "/api/feedback/",
        {"request_id": result.request_id, "deployment": other.slug, "score": 1},
        format="json",
    )
    assert response.status_code == 400 and "deployment" in response.json()
    assert not QualityRecord.objects.exists()
