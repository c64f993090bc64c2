"""Batch jobs: JSONL in the store, lines routed and billed once, output in parts, resumable."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from bench.mockprovider import MockProviderServer
from billing.models import UsageRecord
from inference import tasks
from inference.batch import jobs as batch
from inference.batch import lines as batch_lines
from inference.batch.selectors import batch_job_progress
from inference.models import BatchJob, InferenceRequest
from registry.services import RegistryError
from registry.store.objectstore import default_store
from stack.keys import KeyBudget, api_key_issue
from tests.factories import api_client, make_team
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db
Start = Callable[..., MockProviderServer]


@pytest.fixture(autouse=True)
def _own_store(settings: Any, tmp_path: Path) -> None:
    settings.OBJECT_STORE_URL = f"file://{tmp_path / 'objects'}"
    settings.INFERENCE_BATCH_PART_LINES = 2


def _jsonl(n: int, *, prompt_every: int = 0) -> str:
    rows = []
    for i in range(n):
        if prompt_every and i % prompt_every == 0:
            rows.append({"custom_id": f"c{i}", "prompt": f"say {i}", "max_tokens": 5})
        else:
            rows.append({"custom_id": f"c{i}", "messages": [{"role": "user", "content": f"hi {i}"}]})
    return "\n".join(json.dumps(r) for r in rows) + "\n"


def _run(job: BatchJob) -> BatchJob:
    tasks.batch_job_run.apply(args=(job.pk,))
    job.refresh_from_db()
    return job


def _output(job: BatchJob) -> list[dict[str, Any]]:
    return [json.loads(x) for x in default_store().get(job.output_uri).splitlines()]


def test_a_job_routes_every_line_once_and_writes_jsonl_out(
    operator: User, mock_provider: Start, django_capture_on_commit_callbacks: Any
) -> None:
    server = mock_provider(text="ok")
    workflow = routed_workflow(operator, [priced_deployment(server)])
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        job = batch.batch_job_create(workflow=workflow, user=operator, input_jsonl=_jsonl(5, prompt_every=2))
    assert len(callbacks) == 1 and job.total == 5 and job.state == BatchJob.State.PENDING

    job = _run(job)
    assert job.state == BatchJob.State.SUCCEEDED, job.error
    assert (job.done, job.failed) == (5, 0)
    rows = InferenceRequest.objects.filter(client_request_id__startswith=f"batch:{job.pk}:")
    assert rows.count() == 5 and server.behaviour.total_calls() == 5
    assert job.cost == sum((r.cost for r in rows), Decimal("0")) > 0
    out = _output(job)
    assert [o["custom_id"] for o in out] == [f"c{i}" for i in range(5)]
    assert all(o["response"]["text"] == "ok" and o["error"] is None for o in out)
    assert server.behaviour.calls.get("/v1/completions") == 3  # prompt lines are completions
    # Three parts of at most two lines each were written before the output was joined.
    assert (
        len(
            [k for k in default_store().list("inference/batch/jobs/") if "/part-" in k and f"/{job.pk}-" in k]
        )
        == 3
    )
    progress = batch_job_progress(job=job)
    assert (progress["done"], progress["total"], progress["failed"], progress["fraction"]) == (5, 5, 0, 1.0)

    # A second delivery of the task finds the job finished: nothing is called or billed.
    billed = UsageRecord.objects.count()
    assert _run(job).state == BatchJob.State.SUCCEEDED
    assert server.behaviour.total_calls() == 5 and UsageRecord.objects.count() == billed


def test_a_resumed_job_skips_written_parts_and_replays_recorded_lines_unbilled(
    operator: User, mock_provider: Start
) -> None:
    server = mock_provider(text="ok")
    workflow = routed_workflow(operator, [priced_deployment(server)])
    job = batch.batch_job_create(workflow=workflow, user=operator, input_jsonl=_jsonl(5))
    lines = batch_lines.batch_lines_parse(default_store().get(job.input_uri))

    # What a worker killed mid-job leaves: lines c0..c2 routed and recorded, part 0 (c0, c1)
    # written, the lease gone stale.
    records = [batch._run_line(job, line) for line in lines[:3]]
    default_store().put(batch_lines.part_key(job, 0), batch._dump(records[:2]))
    stale = timezone.now() - timedelta(hours=1)
    BatchJob.objects.filter(pk=job.pk).update(state=BatchJob.State.RUNNING, updated_at=stale, done=3)
    assert server.behaviour.total_calls() == 3
    billed_per_line = UsageRecord.objects.count() // 3
    assert billed_per_line >= 1

    assert batch.batch_jobs_resume() == [job.pk]
    job = _run(job)

    assert job.state == BatchJob.State.SUCCEEDED and (job.done, job.failed) == (5, 0)
    # c2 was replayed from its recorded request; only c3 and c4 reached the provider.
    assert server.behaviour.total_calls() == 5
    assert InferenceRequest.objects.filter(client_request_id__startswith=f"batch:{job.pk}:").count() == 5
    assert UsageRecord.objects.count() == 5 * billed_per_line
    out = _output(job)
    assert [o["custom_id"] for o in out] == [f"c{i}" for i in range(5)]
    assert out[2]["request_id"] == records[2]["request_id"]


def test_a_job_held_by_a_live_runner_is_not_claimed_again(operator: User, mock_provider: Start) -> None:
    server = mock_provider()
    workflow = routed_workflow(operator, [priced_deployment(server)])
    job = batch.batch_job_create(workflow=workflow, user=operator, input_jsonl=_jsonl(2))
    BatchJob.objects.filter(pk=job.pk).update(state=BatchJob.State.RUNNING, updated_at=timezone.now())
    assert batch.batch_job_execute(job_id=job.pk) is None
    assert batch.batch_jobs_resume() == []
    assert server.behaviour.total_calls() == 0


def test_failed_lines_are_counted_and_reported(operator: User, mock_provider: Start) -> None:
    server = mock_provider(status=400)
    workflow = routed_workflow(operator, [priced_deployment(server)])
    job = _run(batch.batch_job_create(workflow=workflow, user=operator, input_jsonl=_jsonl(3)))
    assert job.state == BatchJob.State.SUCCEEDED and (job.done, job.failed) == (0, 3)
    assert all(o["error"] and o["response"] is None for o in _output(job))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"custom_id": "a", "prompt": "x"}\nnot json\n', "line 2: the line is not valid JSON"),
        ('{"custom_id": "a", "prompt": "x"}\n{"custom_id": "a", "prompt": "y"}\n', "duplicate custom_id"),
        ('{"custom_id": "a"}\n', "needs 'messages'"),
        ('{"messages": [{"role": "user"}]}\n', r"line 1: messages\[0\]\.content must be a string"),
        ('{"prompt": "x", "max_tokens": -1}\n', "max_tokens"),
        ('{"prompt": "hi \\ud800"}\n', r"line 1: prompt is not valid Unicode"),
        ('{"custom_id": "a\\udc00", "prompt": "x"}\n', "custom_id is not valid Unicode"),
        ('{"custom_id": "a\\u0000", "prompt": "x"}\n', "custom_id must be printable"),
        ('{"prompt": "x", "n": true}\n', "n must be an integer"),
        ('{"prompt": "x", "deep": ' + "[" * 5000 + "]" * 5000 + "}\n", "nested more than"),
        ("\n\n", "no lines"),
    ],
)
def test_bad_input_is_refused_at_create(operator: User, text: str, message: str) -> None:
    workflow = routed_workflow(operator, [priced_deployment(base_url="http://127.0.0.1:9/v1")])
    with pytest.raises(RegistryError, match=message) as info:
        batch.batch_job_create(workflow=workflow, user=operator, input_jsonl=text)
    assert info.value.field == "input"
    assert not BatchJob.objects.exists()


def test_api_creates_lists_and_shows_progress_by_role(
    operator: User, viewer: User, mock_provider: Start, django_capture_on_commit_callbacks: Any
) -> None:
    server = mock_provider()
    workflow = routed_workflow(operator, [priced_deployment(server)])
    default_store().put("in/batch.jsonl", _jsonl(3).encode())
    client = api_client(operator)

    bad = client.post(
        "/api/batch-jobs/", {"workflow": workflow.slug, "input_uri": "in/missing.jsonl"}, format="json"
    )
    assert bad.status_code == 400 and "input_uri" in bad.json(), bad.content
    bad = client.post("/api/batch-jobs/", {"workflow": workflow.slug, "input_jsonl": "{"}, format="json")
    assert bad.status_code == 400 and "line 1" in str(bad.json()["input"])
    denied = api_client(viewer).post(
        "/api/batch-jobs/", {"workflow": workflow.slug, "input_uri": "in/batch.jsonl"}, format="json"
    )
    assert denied.status_code == 403

    with django_capture_on_commit_callbacks(execute=True):
        created = client.post(
            "/api/batch-jobs/", {"workflow": workflow.slug, "input_uri": "in/batch.jsonl"}, format="json"
        )
    assert created.status_code == 201, created.content
    job_id = created.json()["id"]
    # Eager-free test settings: the queued task went to the broker; run it here.
    _run(BatchJob.objects.get(pk=job_id))

    listed = api_client(viewer).get(f"/api/batch-jobs/?workflow={workflow.slug}")
    assert listed.status_code == 200
    detail = api_client(viewer).get(f"/api/batch-jobs/{job_id}/").json()
    assert (
        detail["state"] == "succeeded"
        and detail["progress"]["done"] == 3
        and detail["progress"]["total"] == 3
    )
    assert detail["output_uri"].endswith("output.jsonl")
    # The cost is for those who may see costs (registry.auth.principal.can_see_costs), not a viewer.
    assert "cost" not in detail and "cost" not in detail["progress"]
    detail = client.get(f"/api/batch-jobs/{job_id}/").json()
    assert Decimal(detail["progress"]["cost"]) > 0 and Decimal(detail["cost"]) > 0


def test_a_cancelled_job_is_not_run_and_a_finished_one_cannot_be_cancelled(
    operator: User, viewer: User, mock_provider: Start
) -> None:
    server = mock_provider()
    workflow = routed_workflow(operator, [priced_deployment(server)])
    job = batch.batch_job_create(workflow=workflow, user=operator, input_jsonl=_jsonl(3))
    assert api_client(viewer).post(f"/api/batch-jobs/{job.pk}/cancel/").status_code == 403
    response = api_client(operator).post(f"/api/batch-jobs/{job.pk}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    assert _run(job).state == BatchJob.State.CANCELLED
    assert server.behaviour.total_calls() == 0
    again = api_client(operator).post(f"/api/batch-jobs/{job.pk}/cancel/")
    assert again.status_code == 400 and "state" in again.json()


def test_a_workflow_without_a_route_fails_the_job_with_its_reason(
    operator: User, mock_provider: Start
) -> None:
    server = mock_provider()
    deployment = priced_deployment(server)
    workflow = routed_workflow(operator, [deployment])
    job = batch.batch_job_create(workflow=workflow, user=operator, input_jsonl=_jsonl(2))
    type(deployment).objects.filter(pk=deployment.pk).update(enabled=False)
    from inference.selectors import route_cache_invalidate

    route_cache_invalidate()
    job = _run(job)
    assert job.state == BatchJob.State.FAILED and job.error
    assert server.behaviour.total_calls() == 0


def test_a_job_made_with_a_key_bills_the_key_and_stops_at_its_hard_budget(
    operator: User, mock_provider: Start
) -> None:
    team = make_team("search")
    # 7 prompt + 3 completion tokens at these prices: $2.50 a line.
    deployment = priced_deployment(
        mock_provider(text="ok"), in_price=Decimal("250000"), out_price=Decimal("250000")
    )
    workflow = routed_workflow(operator, [deployment], team=team)
    issued = api_key_issue(
        user=operator, name="batch", team=team, budget=KeyBudget(limit_amount=Decimal("5"), period="daily")
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    response = client.post(
        "/api/batch-jobs/", {"workflow": workflow.slug, "input_jsonl": _jsonl(4)}, format="json"
    )
    assert response.status_code == 201, response.content
    job = BatchJob.objects.get(pk=response.json()["id"])
    assert job.api_key == issued.token

    job = _run(job)
    assert (job.done, job.failed) == (2, 2)
    assert [o["error"] is None for o in _output(job)] == [True, True, False, False]
    assert "budget exhausted" in _output(job)[2]["error"]
    rows = UsageRecord.objects.all()
    assert {(r.team, r.api_key_id) for r in rows} == {("search", issued.token.pk)}
    assert sum(r.amount for r in rows) == Decimal("5")
