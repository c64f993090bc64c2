"""Replay studies: kept requests replayed through candidate deployments as billed, paced batch
jobs, scored, with figures that reconcile with the ledger; the API's checks and team scoping."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from bench.mockprovider import MockProviderServer
from billing.models import UsageRecord
from decisions.models import ReplayCandidate, ReplayResult, ReplayStudy
from decisions.replay import tasks
from decisions.replay.steps import replay_ledger_total
from inference import admission
from inference.models import BatchJob, InferenceRequest, RetainedPrompt
from inference.ratelimit.limits import rate_limiter_reset
from registry.auth.roles import Role
from registry.models import Deployment, Workflow
from registry.services import api_token_create
from registry.store.objectstore import default_store
from stack.keys import api_key_issue
from tests.factories import api_client, make_member, make_team
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db
Start = Callable[..., MockProviderServer]


@pytest.fixture(autouse=True)
def _own_store(settings: Any, tmp_path: Path) -> None:
    settings.OBJECT_STORE_URL = f"file://{tmp_path / 'objects'}"
    settings.INFERENCE_BATCH_PART_LINES = 25


def _send(user: User, workflow: Workflow, n: int) -> None:
    """n /v1 chat requests, each its own question."""
    _, raw = api_token_create(user=user, name="traffic", team=workflow.team)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    for i in range(n):
        body = {
            "model": workflow.slug,
            "messages": [{"role": "user", "content": f"question {i}"}],
            "max_tokens": 8,
        }
        response = client.post("/v1/chat/completions", json.dumps(body), content_type="application/json")
        assert response.status_code == 200, response.content


def _run(study_id: int) -> ReplayStudy:
    tasks.replay_study_run.apply(args=(study_id,))
    return ReplayStudy.objects.get(pk=study_id)


def _create(client: Any, body: dict[str, Any], callbacks: Any) -> Any:
    with callbacks(execute=False) as queued:
        response = client.post("/api/replay-studies/", body, format="json")
    if response.status_code == 201:
        assert len(queued) == 1  # the study is queued after commit
    return response


def test_a_study_of_100_kept_requests_over_two_candidates_reconciles_with_the_ledger_to_the_cent(
    operator: User, mock_provider: Start, django_capture_on_commit_callbacks: Any
) -> None:
    same = priced_deployment(mock_provider(text="pong"))  # the primary: answers as it did
    cheaper = priced_deployment(
        mock_provider(text="pong!", tokens_in=7, tokens_out=2),
        in_price=Decimal("0.25"),
        out_price=Decimal("1.1"),
    )
    workflow = routed_workflow(operator, [same], retain_prompts=True, prompt_retention_days=30)
    _send(operator, workflow, 100)
    kept_ids = set(
        RetainedPrompt.objects.filter(workflow=workflow).values_list("inference_request_id", flat=True)
    )
    assert len(kept_ids) == 100

    client = api_client(operator)
    response = _create(
        client,
        {
            "workflow": workflow.slug,
            "deployments": [same.slug, cheaper.slug],
            "sample_size": 100,
            "scorer": "exact",
        },
        django_capture_on_commit_callbacks,
    )
    assert response.status_code == 201, response.content
    assert response.json()["baseline_deployment"] == same.slug
    study = _run(response.json()["id"])
    assert study.state == ReplayStudy.State.SUCCEEDED, study.error
    assert set(study.sampled_request_ids) == kept_ids

    by_slug = {
        c.deployment.slug: c for c in ReplayCandidate.objects.filter(study=study).select_related("deployment")
    }
    assert set(by_slug) == {same.slug, cheaper.slug}
    for slug, candidate in by_slug.items():
        assert (candidate.requests, candidate.succeeded) == (100, 100)
        job = BatchJob.objects.get(pk=candidate.batch_job_id)
        assert job.deployment_id == candidate.deployment_id and job.state == BatchJob.State.SUCCEEDED
        replayed = InferenceRequest.objects.filter(client_request_id__startswith=f"batch:{job.pk}:")
        assert replayed.count() == 100 and set(replayed.values_list("deployment__slug", flat=True)) == {slug}
        # Billed: the ledger rows of the replayed requests are the candidate's cost, to the cent
        # (and to the nano-dollar), and the batch job's.
        ledger = replay_ledger_total(candidate=candidate)
        assert ledger > 0 and candidate.cost_total == ledger == job.cost
        rows = UsageRecord.objects.filter(
            subject_type="inference_request",
            subject_id__in=[str(pk) for pk in replayed.values_list("pk", flat=True)],
        )
        assert sum(r.amount for r in rows) == candidate.cost_total
        assert {r.api_key_id for r in rows} == {study.api_key_id} and study.api_key_id is not None
        results = ReplayResult.objects.filter(candidate=candidate)
        assert results.count() == 100
        assert sum((r.cost for r in results), Decimal(0)) == candidate.cost_total
        assert set(results.values_list("original_request_id", flat=True)) == kept_ids
        assert candidate.cost_per_request == (candidate.cost_total / 100).quantize(Decimal("0.000000001"))
        assert candidate.cost_per_1m_requests == (candidate.cost_total / 100 * 1_000_000).quantize(
            Decimal("0.000001")
        )
        assert candidate.latency_p50_ms is not None and candidate.latency_p95_ms is not None
        assert candidate.latency_p95_ci_ms is not None
        # The replay's objects held kept prompts: gone now that the study finished.
        assert job.holds_prompts_until is None
        assert default_store().list(f"inference/batch/jobs/{job.pk}-") == []
        assert set(replayed.values_list("response_text", flat=True)) == {""}

    baseline, candidate = by_slug[same.slug], by_slug[cheaper.slug]
    assert baseline.quality_mean == Decimal("1.0000") and candidate.quality_mean == Decimal("0.0000")
    assert candidate.cost_per_request < baseline.cost_per_request
    assert candidate.paired_requests == 100 and candidate.quality_delta == Decimal("-1.0000")
    assert candidate.cost_delta_per_request == candidate.cost_per_request - baseline.cost_per_request
    assert baseline.paired_requests == 0 and baseline.quality_delta is None
    # Replays are never kept themselves.
    assert RetainedPrompt.objects.filter(workflow=workflow).count() == 100

    evidence = client.get(f"/api/replay-studies/{study.pk}/results/?limit=500").json()
    assert evidence["count"] == 200
    first = evidence["results"][0]
    assert first["original_request"] in kept_ids and first["replay_request"] is not None
    assert "request" not in first and "response_text" not in first  # evidence, never the prompt
    detail = client.get(f"/api/replay-studies/{study.pk}/").json()
    assert {c["deployment"] for c in detail["candidates"]} == {same.slug, cheaper.slug}
    assert detail["state"] == "succeeded"
    page = Client()
    page.force_login(operator)
    html = page.get(f"/decisions/replays/{study.pk}/")
    assert html.status_code == 200 and cheaper.slug.encode() in html.content and b"baseline" in html.content
    assert str(study.pk).encode() in page.get("/decisions/replays/").content


def test_a_judge_scores_the_answers_and_its_calls_are_billed(
    operator: User, mock_provider: Start, django_capture_on_commit_callbacks: Any
) -> None:
    primary = priced_deployment(mock_provider(text="pong"))
    judge = priced_deployment(mock_provider(text="0.8"))
    workflow = routed_workflow(operator, [primary], retain_prompts=True, prompt_retention_days=2)
    _send(operator, workflow, 4)
    response = _create(
        api_client(operator),
        {
            "workflow": workflow.slug,
            "deployments": [primary.slug],
            "scorer": "judge",
            "judge_deployment": judge.slug,
        },
        django_capture_on_commit_callbacks,
    )
    assert response.status_code == 201, response.content
    study = _run(response.json()["id"])
    assert study.state == ReplayStudy.State.SUCCEEDED, study.error
    candidate = study.candidates.get()
    assert candidate.quality_mean == Decimal("0.8000") and candidate.quality_ci == Decimal("0.0000")
    results = list(candidate.results.all())
    assert len(results) == 4 and all(r.judge_request_id is not None for r in results)
    judged = UsageRecord.objects.filter(
        subject_type="inference_request", subject_id__in=[str(r.judge_request_id) for r in results]
    )
    assert candidate.judge_cost_total == sum(r.amount for r in judged) > 0
    assert {r.deployment_id for r in judged} == {judge.pk}


def test_replay_lines_wait_for_the_study_pace_and_the_workflow_limit_rather_than_fail(
    operator: User, mock_provider: Start, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.RATE_LIMIT_WINDOW_SECONDS = 1.0
    rate_limiter_reset()
    try:
        primary = priced_deployment(mock_provider(text="pong"))
        workflow = routed_workflow(operator, [primary], retain_prompts=True, prompt_retention_days=2)
        _send(operator, workflow, 5)
        Workflow.objects.filter(pk=workflow.pk).update(rpm_limit=3)
        response = _create(
            api_client(operator),
            {"workflow": workflow.slug, "deployments": [primary.slug], "max_rpm": 2},
            django_capture_on_commit_callbacks,
        )
        assert response.status_code == 201, response.content
        settings.INFERENCE_BATCH_PART_LINES = 100
        study = ReplayStudy.objects.get(pk=response.json()["id"])
        # Read the output before the study deletes it: run the candidate's job through the study.
        from decisions.replay import services as replay

        waits: list[int] = []
        real_scrub = replay.batch_jobs_scrub

        def scrub_after_reading(*, jobs: Any) -> int:
            for job in jobs:
                if job.output_uri:
                    lines = default_store().get(job.output_uri).splitlines()
                    waits.extend(json.loads(line).get("rate_limit_waits", 0) for line in lines)
            return real_scrub(jobs=jobs)

        replay.batch_jobs_scrub = scrub_after_reading  # type: ignore[assignment]
        try:
            study = _run(study.pk)
        finally:
            replay.batch_jobs_scrub = real_scrub  # type: ignore[assignment]
        assert study.state == ReplayStudy.State.SUCCEEDED, study.error
        candidate = study.candidates.get()
        assert (candidate.requests, candidate.succeeded) == (5, 5)
        assert len(waits) == 5 and sum(waits) > 0  # 2 per window: the later lines waited
    finally:
        rate_limiter_reset()


def test_bad_study_inputs_answer_400_with_field_messages(
    operator: User, mock_provider: Start, django_capture_on_commit_callbacks: Any
) -> None:
    primary = priced_deployment(mock_provider(text="pong"))
    disabled = priced_deployment(base_url="http://127.0.0.1:9/v1")
    Deployment.objects.filter(pk=disabled.pk).update(enabled=False)
    plain = routed_workflow(operator, [primary])
    empty = routed_workflow(operator, [primary], retain_prompts=True, prompt_retention_days=2)
    kept = routed_workflow(operator, [primary], retain_prompts=True, prompt_retention_days=2)
    _send(operator, kept, 1)
    client = api_client(operator)

    def refused(body: dict[str, Any]) -> dict[str, Any]:
        response = _create(
            client, {"deployments": [primary.slug], **body}, django_capture_on_commit_callbacks
        )
        assert response.status_code == 400, response.content
        return dict(response.json())

    assert "keep prompts" in refused({"workflow": plain.slug})["workflow"][0]
    assert "no kept requests" in refused({"workflow": empty.slug})["workflow"][0]
    assert "deployments" in refused({"workflow": kept.slug, "deployments": ["no-such-deployment"]})
    assert "disabled" in refused({"workflow": kept.slug, "deployments": [disabled.slug]})["deployments"][0]
    assert "deployments" in refused({"workflow": kept.slug, "deployments": []})
    assert "sample_size" in refused({"workflow": kept.slug, "sample_size": 0})
    assert "sample_size" in refused({"workflow": kept.slug, "sample_size": 5001})
    assert "judge_deployment" in refused({"workflow": kept.slug, "scorer": "judge"})
    assert "scorer" in refused({"workflow": kept.slug, "scorer": "vibes"})
    assert "scorer_config" in refused({"workflow": kept.slug, "scorer": "regex"})
    assert "max_rpm" in refused({"workflow": kept.slug, "max_rpm": 0})
    assert not ReplayStudy.objects.exists()


def test_another_teams_study_is_404_and_its_workflow_cannot_be_named(
    mock_provider: Start, django_capture_on_commit_callbacks: Any
) -> None:
    team_a, team_b = make_team("replay-a"), make_team("replay-b")
    operator_a = make_member(team_a, Role.OPERATOR)
    operator_b = make_member(team_b, Role.OPERATOR)
    viewer_a = make_member(team_a, Role.VIEWER)
    primary = priced_deployment(mock_provider(text="pong"))
    workflow = routed_workflow(
        operator_a, [primary], team=team_a, retain_prompts=True, prompt_retention_days=2
    )
    _send(operator_a, workflow, 2)
    body = {"workflow": workflow.slug, "deployments": [primary.slug]}
    # A viewer of the team reads but does not create.
    assert _create(api_client(viewer_a), body, django_capture_on_commit_callbacks).status_code == 403
    made = _create(api_client(operator_a), body, django_capture_on_commit_callbacks)
    assert made.status_code == 201, made.content
    study_id = made.json()["id"]

    other = api_client(operator_b)
    assert other.get(f"/api/replay-studies/{study_id}/").status_code == 404
    assert other.get(f"/api/replay-studies/{study_id}/results/").status_code == 404
    assert other.get("/api/replay-studies/").json()["results"] == []
    refused = _create(other, body, django_capture_on_commit_callbacks)
    assert refused.status_code == 400 and "workflow" in refused.json()
    assert api_client(viewer_a).get(f"/api/replay-studies/{study_id}/").status_code == 200
    page = Client()
    page.force_login(operator_b)
    assert page.get(f"/decisions/replays/{study_id}/").status_code == 404
    assert ReplayStudy.objects.count() == 1


def test_a_study_whose_worker_died_is_resumed_by_beat_without_billing_twice(
    operator: User, mock_provider: Start, django_capture_on_commit_callbacks: Any
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from decisions.replay import services as replay
    from decisions.replay import steps

    first_dep = priced_deployment(mock_provider(text="pong"))
    second_dep = priced_deployment(mock_provider(text="pong"))
    workflow = routed_workflow(operator, [first_dep], retain_prompts=True, prompt_retention_days=2)
    _send(operator, workflow, 10)
    made = _create(
        api_client(operator),
        {"workflow": workflow.slug, "deployments": [second_dep.slug]},
        django_capture_on_commit_callbacks,
    )
    study_id = made.json()["id"]
    # A runner gets through the first candidate, then dies.
    assert replay._claim(study_id)
    study = ReplayStudy.objects.get(pk=study_id)
    kept = steps.study_sample(study)
    first = study.candidates.order_by("pk").first()
    assert first is not None
    steps.candidate_replay(study, first, kept)
    billed = UsageRecord.objects.count()
    with django_capture_on_commit_callbacks(execute=False) as queued:
        assert replay.replay_studies_resume() == []  # its heartbeat is fresh: not yet
    assert queued == []
    ReplayStudy.objects.filter(pk=study_id).update(updated_at=timezone.now() - timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=False) as queued:
        assert replay.replay_studies_resume() == [study_id]
    assert len(queued) == 1 and ReplayStudy.objects.get(pk=study_id).state == ReplayStudy.State.PENDING

    study = _run(study_id)
    assert study.state == ReplayStudy.State.SUCCEEDED, study.error
    candidates = list(study.candidates.order_by("pk"))
    assert [(c.requests, c.succeeded) for c in candidates] == [(10, 10), (10, 10)]
    # The first candidate's lines were not called again: only the second one's were billed now.
    second_job = candidates[1].batch_job
    assert second_job is not None
    new_rows = UsageRecord.objects.count() - billed
    assert (
        new_rows
        == UsageRecord.objects.filter(
            subject_id__in=[
                str(pk)
                for pk in InferenceRequest.objects.filter(
                    client_request_id__startswith=f"batch:{second_job.pk}:"
                ).values_list("pk", flat=True)
            ]
        ).count()
    )
    assert all(c.cost_total == replay_ledger_total(candidate=c) for c in candidates)


def test_a_replay_asked_for_with_a_key_paces_its_calls_in_the_keys_v1_window(
    operator: User,
    mock_provider: Start,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    django_capture_on_commit_callbacks: Any,
) -> None:
    # Issue 25 finding 4: every provider call counts in the caller's /v1 windows. The windows
    # live in this process here, so a wait moves the frozen clock on instead of sleeping.
    settings.RATE_LIMIT_REDIS_URL = ""
    rate_limiter_reset()
    try:
        server = mock_provider(text="pong")
        team = make_team("search")
        primary = priced_deployment(server)
        workflow = routed_workflow(
            operator, [primary], team=team, retain_prompts=True, prompt_retention_days=2
        )
        _send(operator, workflow, 4)
        issued = api_key_issue(user=operator, name="rpm3", team=team, rpm_limit=3)
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
        response = _create(
            client,
            {"workflow": workflow.slug, "deployments": [primary.slug]},
            django_capture_on_commit_callbacks,
        )
        assert response.status_code == 201, response.content
        waits: list[int] = []
        with time_machine.travel(timezone.now(), tick=False) as traveller:

            def wait(seconds: float) -> None:
                waits.append(server.behaviour.total_calls())
                traveller.shift(seconds)

            monkeypatch.setattr(admission, "_sleep", wait)
            study = _run(response.json()["id"])
        assert study.state == ReplayStudy.State.SUCCEEDED, study.error
        assert study.candidates.get().succeeded == 4
        # The 4 /v1 requests were another key's; the replay's 4 calls go 3 in a window, then 1.
        assert set(waits) == {4 + 3}
        assert server.behaviour.total_calls() == 8
    finally:
        rate_limiter_reset()
