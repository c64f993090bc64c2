"""Eval sets run against one deployment at a time through the router: recorded, billed, scored."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from bench.mockprovider import MockProviderServer
from billing.models import UsageRecord
from inference import tasks
from inference.models import EvalRun, EvalSet, InferenceRequest, QualityRecord
from inference.quality import services as quality
from registry.services import RegistryError
from stack.keys import KeyBudget, api_key_issue
from tests.factories import make_team
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db
Start = Callable[..., MockProviderServer]


def _run(run: EvalRun) -> EvalRun:
    # The task itself, executed in this process (the worker's code path, without a broker).
    tasks.eval_set_run.apply(args=(run.pk,))
    run.refresh_from_db()
    return run


def test_eval_run_scores_each_case_and_bills_each_call_once(
    operator: User, mock_provider: Start, django_capture_on_commit_callbacks: Any
) -> None:
    server = mock_provider(text="Paris")
    deployment = priced_deployment(server)
    workflow = routed_workflow(operator, [deployment])
    eval_set = quality.eval_set_create(
        workflow=workflow,
        name="capitals",
        cases=[
            {"prompt": "Capital of France?", "expected": "Paris", "scorer": "exact"},
            {"prompt": "Capital of Italy?", "expected": "Rome", "scorer": "contains"},
            {"prompt": "Capital, as a word", "expected": r"^[A-Z][a-z]+$", "scorer": "regex"},
        ],
        user=operator,
    )
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        run = quality.eval_run_start(eval_set=eval_set, deployment=deployment, user=operator)
    assert len(callbacks) == 1  # the task is queued after COMMIT
    run = _run(run)

    assert run.state == EvalRun.State.SUCCEEDED
    assert (run.cases_total, run.cases_done) == (3, 3)
    assert run.mean_score == pytest.approx(2 / 3)
    records = QualityRecord.objects.filter(eval_run=run).order_by("eval_case__position")
    assert [float(r.score) for r in records] == [1.0, 0.0, 1.0]
    assert {r.source for r in records} == {QualityRecord.Source.EVAL}
    assert all(r.deployment_id == deployment.pk and r.workflow_id == workflow.pk for r in records)
    requests = InferenceRequest.objects.filter(client_request_id__startswith=f"eval:{run.pk}:")
    assert requests.count() == 3 and server.behaviour.total_calls() == 3
    assert run.cost > 0 and run.cost == sum(r.cost for r in requests)

    # A second delivery of the task does nothing: the run was claimed.
    _run(run)
    assert server.behaviour.total_calls() == 3
    assert QualityRecord.objects.filter(eval_run=run).count() == 3


def test_rerun_after_a_crash_replays_recorded_answers(operator: User, mock_provider: Start) -> None:
    server = mock_provider(text="4")
    deployment = priced_deployment(server)
    workflow = routed_workflow(operator, [deployment])
    eval_set = quality.eval_set_create(
        workflow=workflow,
        name="sums",
        cases=[
            {"prompt": "2+2?", "expected": "4", "scorer": "numeric"},
            {"prompt": "1+2?", "expected": "3", "scorer": "numeric", "scorer_config": {"tolerance": 1}},
        ],
    )
    run = quality.eval_run_start(eval_set=eval_set, deployment=deployment)
    _run(run)
    billed = InferenceRequest.objects.filter(client_request_id__startswith=f"eval:{run.pk}:")
    assert billed.count() == 2
    # A worker died after its calls were recorded but before the scores: the run is handed out
    # again with one score missing; the answer is replayed, not paid for a second time.
    QualityRecord.objects.filter(eval_run=run, eval_case__position=1).delete()
    EvalRun.objects.filter(pk=run.pk).update(state=EvalRun.State.PENDING, cases_done=1)
    run = _run(run)
    assert server.behaviour.total_calls() == 2 and billed.count() == 2
    assert [
        float(r.score) for r in QualityRecord.objects.filter(eval_run=run).order_by("eval_case__position")
    ] == [
        1.0,
        1.0,
    ]
    assert run.state == EvalRun.State.SUCCEEDED and run.mean_score == 1.0


def test_judge_scorer_asks_another_deployment(operator: User, mock_provider: Start) -> None:
    answerer = priced_deployment(mock_provider(text="A long, polite answer."))
    judge_server = mock_provider(text="0.75")
    judge = priced_deployment(judge_server)
    workflow = routed_workflow(operator, [answerer])
    eval_set = quality.eval_set_create(workflow=workflow, name="tone")
    quality.eval_case_create(
        eval_set=eval_set,
        prompt="Say hello",
        scorer="judge",
        judge_deployment=judge,
        scorer_config={"criteria": "polite"},
    )
    run = _run(quality.eval_run_start(eval_set=eval_set, deployment=answerer))
    record = QualityRecord.objects.get(eval_run=run)
    assert float(record.score) == 0.75 and record.deployment_id == answerer.pk
    assert "polite" in judge_server.behaviour.last_body["messages"][0]["content"]
    judge_request = InferenceRequest.objects.get(
        client_request_id=f"eval:{run.pk}:{record.eval_case_id}:judge"
    )
    assert judge_request.deployment_id == judge.pk
    calls = InferenceRequest.objects.filter(client_request_id__startswith=f"eval:{run.pk}:")
    assert calls.count() == 2 and run.cost == sum(r.cost for r in calls)  # answer + verdict


def test_failed_calls_score_zero(operator: User, mock_provider: Start) -> None:
    deployment = priced_deployment(mock_provider(status=500))
    workflow = routed_workflow(operator, [deployment])
    eval_set = quality.eval_set_create(
        workflow=workflow, name="x", cases=[{"prompt": "p", "expected": "e", "scorer": "exact"}]
    )
    run = _run(quality.eval_run_start(eval_set=eval_set, deployment=deployment))
    record = QualityRecord.objects.get(eval_run=run)
    assert record.score == Decimal("0") and record.comment.startswith("call failed")
    assert run.state == EvalRun.State.SUCCEEDED and run.mean_score == 0.0


def test_bad_cases_are_refused_when_created(operator: User) -> None:
    deployment = priced_deployment(base_url="http://127.0.0.1:9/v1")
    workflow = routed_workflow(operator, [deployment])
    with pytest.raises(RegistryError) as err:
        quality.eval_set_create(
            workflow=workflow, name="bad", cases=[{"prompt": "p", "expected": "(", "scorer": "regex"}]
        )
    assert err.value.field == "cases" and "regular expression" in str(err.value)
    assert not EvalSet.objects.filter(workflow=workflow).exists()  # all or nothing
    eval_set = quality.eval_set_create(workflow=workflow, name="ok")
    with pytest.raises(RegistryError) as err:
        quality.eval_case_create(eval_set=eval_set, prompt="p", expected='{"type": 5}', scorer="json_schema")
    assert err.value.field == "expected"
    with pytest.raises(RegistryError) as err:
        quality.eval_run_start(eval_set=eval_set, deployment=deployment)
    assert err.value.field == "eval_set"  # no cases yet


def test_scheduled_task_runs_every_deployment_of_the_route_once(operator: User, mock_provider: Start) -> None:
    first = priced_deployment(mock_provider(text="yes"))
    second = priced_deployment(mock_provider(text="no"))
    workflow = routed_workflow(operator, [first, second])
    scheduled = quality.eval_set_create(
        workflow=workflow,
        name="nightly",
        schedule_enabled=True,
        cases=[{"prompt": "Agree?", "expected": "yes", "scorer": "exact"}],
    )
    quality.eval_set_create(
        workflow=workflow, name="manual", cases=[{"prompt": "Agree?", "expected": "yes", "scorer": "exact"}]
    )
    assert tasks.eval_sets_scheduled.apply().get() == 2
    runs = EvalRun.objects.filter(eval_set=scheduled)
    assert {r.deployment_id for r in runs} == {first.pk, second.pk}
    assert {r.trigger for r in runs} == {EvalRun.Trigger.SCHEDULE}
    # Runs still pending: the next beat tick starts nothing new.
    assert tasks.eval_sets_scheduled.apply().get() == 0
    for run in runs:
        _run(run)
    scores = dict(
        QualityRecord.objects.filter(eval_run__eval_set=scheduled).values_list("deployment_id", "score")
    )
    assert scores == {first.pk: Decimal("1"), second.pk: Decimal("0")}
    assert tasks.eval_sets_scheduled.apply().get() == 2


def test_a_run_left_running_by_a_dead_worker_is_handed_out_again(
    operator: User, mock_provider: Start, django_capture_on_commit_callbacks: Any
) -> None:
    server = mock_provider(text="yes")
    deployment = priced_deployment(server)
    workflow = routed_workflow(operator, [deployment])
    eval_set = quality.eval_set_create(
        workflow=workflow,
        name="resume",
        schedule_enabled=True,
        cases=[{"prompt": f"q{i}", "expected": "yes", "scorer": "exact"} for i in range(3)],
    )
    run = _run(quality.eval_run_start(eval_set=eval_set, deployment=deployment))
    # As a worker killed after the first case: running, one score, the other calls never made.
    QualityRecord.objects.filter(eval_run=run, eval_case__position__gt=0).delete()
    InferenceRequest.objects.filter(client_request_id__startswith=f"eval:{run.pk}:").exclude(
        client_request_id=f"eval:{run.pk}:{eval_set.cases.get(position=0).pk}"
    ).update(client_request_id=None)
    EvalRun.objects.filter(pk=run.pk).update(state=EvalRun.State.RUNNING, cases_done=1, mean_score=None)
    calls_before = server.behaviour.total_calls()

    assert quality.eval_runs_requeue_stale(stale_after_s=3600) == []  # recent progress: left alone
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert quality.eval_runs_requeue_stale(stale_after_s=0) == [run.pk]
    assert len(callbacks) == 1
    # The scheduler starts no second run beside it.
    assert quality.eval_sets_scheduled() == []
    run = _run(run)
    assert run.state == EvalRun.State.SUCCEEDED and run.cases_done == 3 and run.mean_score == 1.0
    assert server.behaviour.total_calls() == calls_before + 2  # only the unscored cases are called
    assert QualityRecord.objects.filter(eval_run=run).count() == 3


def test_an_eval_run_made_with_a_team_key_bills_the_key_and_stops_at_its_hard_budget(
    operator: User, mock_provider: Start
) -> None:
    team = make_team("search")
    # 7 prompt + 3 completion tokens at these prices: $2.50 a call.
    deployment = priced_deployment(
        mock_provider(text="Paris"), in_price=Decimal("250000"), out_price=Decimal("250000")
    )
    workflow = routed_workflow(operator, [deployment], team=team)
    eval_set = quality.eval_set_create(
        workflow=workflow,
        name="capitals",
        cases=[{"prompt": f"Capital {i}?", "expected": "Paris", "scorer": "exact"} for i in range(3)],
        user=operator,
    )
    issued = api_key_issue(
        user=operator, name="evals", team=team, budget=KeyBudget(limit_amount=Decimal("5"), period="daily")
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    response = client.post(
        "/api/eval-runs/", {"eval_set": eval_set.pk, "deployment": deployment.slug}, format="json"
    )
    assert response.status_code == 201, response.content
    run = EvalRun.objects.get(pk=response.json()["id"])
    assert run.api_key == issued.token

    _run(run)
    rows = UsageRecord.objects.all()
    assert {(r.team, r.api_key_id) for r in rows} == {("search", issued.token.pk)}
    assert sum(r.amount for r in rows) == Decimal("5")  # the third case was refused, unbilled
