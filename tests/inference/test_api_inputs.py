"""Inference's /api/ endpoints (chaos, eval sets and runs, feedback, batch jobs) and pages answer bad
input with a 4xx naming the field, never a 500, and change nothing."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from inference.models import BatchJob, ChaosConfig, EvalCase, QualityRecord
from inference.quality.services import eval_set_create
from tests.factories import api_client, make_deployment, make_workflow

pytestmark = pytest.mark.django_db

DEEP = 100_000


@pytest.mark.parametrize("body", ["[true]", '"on"', "[]", "1"])
@pytest.mark.parametrize("method", ["patch", "put"])
def test_a_chaos_change_that_is_not_a_json_object_is_400(operator: User, body: str, method: str) -> None:
    deployment = make_deployment()
    client = api_client(operator)
    response = getattr(client, method)(
        f"/api/chaos/{deployment.slug}/", body, content_type="application/json"
    )
    assert response.status_code == 400
    assert "must be a JSON object" in response.json()["detail"]
    assert not ChaosConfig.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"enabled": True, "error_rate": "١"}, "error_rate"),
        ({"enabled": True, "latency_ms": "١٠"}, "latency_ms"),
        ({"enabled": True, "status_codes": ["٥٠٣"]}, "status_codes"),
    ],
)
def test_chaos_numbers_in_other_digits_are_refused(
    operator: User, body: dict[str, object], field: str
) -> None:
    deployment = make_deployment()
    response = api_client(operator).patch(f"/api/chaos/{deployment.slug}/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert not ChaosConfig.objects.exists()


def test_a_chaos_patch_in_a_form_body_merges_like_json(operator: User) -> None:
    deployment = make_deployment()
    response = api_client(operator).patch(
        f"/api/chaos/{deployment.slug}/",
        "enabled=true&error_rate=0.5",
        content_type="application/x-www-form-urlencoded",
    )
    assert response.status_code == 200, response.json()
    assert ChaosConfig.objects.get().error_rate == 0.5


@pytest.mark.parametrize("bad_id", ["abc", "²", "١"])
def test_cancelling_a_batch_job_or_adding_an_eval_case_by_a_malformed_id_is_404(
    operator: User, bad_id: str
) -> None:
    client = api_client(operator)
    assert client.post(f"/api/batch-jobs/{bad_id}/cancel/").status_code == 404
    assert client.post(f"/api/eval-sets/{bad_id}/cases/", {"prompt": "p"}, format="json").status_code == 404


def test_an_eval_case_position_beyond_its_column_is_400(operator: User) -> None:
    workflow = make_workflow(owner=operator)
    eval_set = eval_set_create(workflow=workflow, name="s")
    response = api_client(operator).post(
        f"/api/eval-sets/{eval_set.pk}/cases/", {"prompt": "p", "position": 2**40}, format="json"
    )
    assert response.status_code == 400
    assert "position" in response.json()
    assert not EvalCase.objects.exists()


def test_an_eval_case_scorer_config_nested_deeply_in_a_form_is_400(operator: User) -> None:
    workflow = make_workflow(owner=operator)
    eval_set = eval_set_create(workflow=workflow, name="s")
    response = api_client(operator).post(
        f"/api/eval-sets/{eval_set.pk}/cases/",
        {"prompt": "p", "scorer_config": "[" * DEEP + "]" * DEEP},
        format="multipart",
    )
    assert response.status_code == 400
    assert "nested more than" in str(response.json()["scorer_config"])


@pytest.mark.parametrize("query", ["eval_set=²", "eval_set=abc", "eval_set=99999999999999999999999"])
def test_listing_eval_runs_by_an_eval_set_that_is_no_id_is_400(viewer: User, query: str) -> None:
    response = api_client(viewer).get(f"/api/eval-runs/?{query}")
    assert response.status_code == 400
    assert list(response.json()) == ["eval_set"]


@pytest.mark.parametrize("score", ["١", "NaN", "Infinity"])
def test_feedback_with_a_score_that_is_no_finite_ascii_number_is_400(operator: User, score: str) -> None:
    deployment = make_deployment()
    response = api_client(operator).post(
        "/api/feedback/", {"deployment": deployment.slug, "score": score}, format="multipart"
    )
    assert response.status_code == 400
    assert "score" in response.json()
    assert not QualityRecord.objects.exists()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": ' + "[" * DEEP + "]" * DEEP + "}", "line 1: the line is nested more than"),
        ('{"prompt": "x", "temperature": NaN}', "line 1: the line is not valid JSON"),
        ('{"prompt": "\\ud800"}', "line 1: prompt is not valid Unicode"),
    ],
)
def test_a_batch_line_that_is_deep_non_finite_or_not_unicode_is_400_naming_the_line(
    operator: User, line: str, message: str
) -> None:
    workflow = make_workflow(owner=operator)
    response = api_client(operator).post(
        "/api/batch-jobs/", {"workflow": workflow.slug, "input_jsonl": line + "\n"}, format="json"
    )
    assert response.status_code == 400
    assert message in " ".join(response.json()["input"])
    assert not BatchJob.objects.exists()


def test_the_chaos_form_refuses_an_error_rate_in_other_digits(operator: User) -> None:
    workflow = make_workflow(owner=operator)
    deployment = workflow.policy_versions.get().ordered_deployments()[0]
    client = Client()
    client.force_login(operator)
    response = client.post(
        f"/inference/workflows/{workflow.slug}/",
        {"deployment": deployment.pk, "enabled": "on", "error_rate": "٠٫٥"},
    )
    assert response.status_code == 400
    assert "ASCII digits" in response.content.decode()
    assert not ChaosConfig.objects.exists()
