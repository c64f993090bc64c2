"""Idempotency keys replay an answer only inside their scope: the token's user and the workflow;
batch and eval keys live where no /v1 caller can write; bad keys are refused before any call."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from bench.mockprovider import MockProviderServer
from inference import tasks
from inference.batch import jobs as batch
from inference.models import BatchJob, EvalRun, InferenceRequest, QualityRecord
from inference.quality import services as quality
from registry.auth.roles import Role
from registry.models import Workflow
from registry.services import api_token_create
from registry.store.objectstore import default_store
from tests.factories import api_client, make_user
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db
Start = Callable[..., MockProviderServer]


@pytest.fixture(autouse=True)
def _own_store(settings: Any, tmp_path: Path) -> None:
    settings.OBJECT_STORE_URL = f"file://{tmp_path / 'objects'}"


def _token(user: User, *, workflows: list[Workflow] | None = None) -> tuple[Any, Client]:
    token, raw = api_token_create(user=user, name="idempotency", workflows=workflows or ())
    return token, Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def _ask(client: Client, workflow: Workflow, key: str) -> Any:
    body = json.dumps({"model": workflow.slug, "messages": [{"role": "user", "content": "ping"}]})
    return client.post(
        "/v1/chat/completions", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )


def _text(response: Any) -> str:
    assert response.status_code == 200, response.content
    return str(response.json()["choices"][0]["message"]["content"])


def test_a_users_tokens_share_their_replays_and_another_user_gets_a_fresh_answer(
    viewer: User, mock_provider: Start
) -> None:
    server = mock_provider(text="first answer")
    # Only a workflow that keeps prompts keeps an answer to replay (test_idempotent_answers).
    workflow = routed_workflow(
        viewer, [priced_deployment(server)], retain_prompts=True, prompt_retention_days=1
    )
    _, mine = _token(viewer)
    _, my_other = _token(viewer)
    _, theirs = _token(make_user(Role.VIEWER))

    assert _text(_ask(mine, workflow, "k-1")) == "first answer"
    server.behaviour.text = "second answer"
    assert _text(_ask(mine, workflow, "k-1")) == "first answer"  # replayed, not called
    assert _text(_ask(my_other, workflow, "k-1")) == "first answer"  # the same caller
    assert _text(_ask(theirs, workflow, "k-1")) == "second answer"  # another caller: its own
    assert server.behaviour.total_calls() == 2
    assert InferenceRequest.objects.count() == 2


def test_a_token_limited_to_workflow_b_never_gets_an_answer_recorded_for_workflow_a(
    viewer: User, mock_provider: Start
) -> None:
    server = mock_provider(text="A's private answer")
    a = routed_workflow(viewer, [priced_deployment(server)], retain_prompts=True, prompt_retention_days=1)
    b = routed_workflow(viewer, [priced_deployment(server)], retain_prompts=True, prompt_retention_days=1)
    token, client = _token(viewer)
    assert _text(_ask(client, a, "same-key")) == "A's private answer"

    # The same token, now limited to B, sends the same key for B: a fresh answer from B's route.
    token.workflows.set([b])
    server.behaviour.text = "B's answer"
    assert _text(_ask(client, b, "same-key")) == "B's answer"
    # ... and A itself is out of its reach, replay or not.
    refused = _ask(client, a, "same-key")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "workflow_not_allowed"
    # Another token of the user, limited to B from the start, sees B's answer only.
    _, scoped = _token(viewer, workflows=[b])
    assert _text(_ask(scoped, b, "same-key")) == "B's answer"
    rows = InferenceRequest.objects.order_by("pk")
    assert [r.workflow_id for r in rows] == [a.pk, b.pk]


def test_v1_callers_cannot_pre_record_the_answers_of_a_batch_job(
    operator: User, mock_provider: Start, django_capture_on_commit_callbacks: Any
) -> None:
    server = mock_provider(text="planted")
    workflow = routed_workflow(operator, [priced_deployment(server)])
    lines = [{"messages": [{"role": "user", "content": "hi"}]}, {"custom_id": "c1", "prompt": "x"}]
    with django_capture_on_commit_callbacks(execute=False):
        job = batch.batch_job_create(
            workflow=workflow, user=operator, input_jsonl="\n".join(json.dumps(x) for x in lines) + "\n"
        )
    # An attacker with any token guesses the lines' keys, in every spelling it can think of.
    _, attacker = _token(make_user(Role.VIEWER))
    for key in (f"batch:{job.pk}:line-1", f"batch:{job.pk}:c1", "batch:1:line-0", f"v1:{job.pk}:c1"):
        assert _text(_ask(attacker, workflow, key)) == "planted"
    server.behaviour.text = "genuine"
    tasks.batch_job_run.apply(args=(job.pk,))
    job.refresh_from_db()
    assert job.state == BatchJob.State.SUCCEEDED
    out = [json.loads(x) for x in default_store().get(job.output_uri).splitlines()]
    assert [o["response"]["text"] for o in out] == ["genuine", "genuine"]
    assert InferenceRequest.objects.filter(client_request_id__startswith="v1:").count() == 4
    assert InferenceRequest.objects.filter(client_request_id__startswith=f"batch:{job.pk}:").count() == 2


def test_v1_callers_cannot_pre_record_the_answers_of_an_eval_run(
    operator: User, mock_provider: Start, django_capture_on_commit_callbacks: Any
) -> None:
    server = mock_provider(text="Paris")
    deployment = priced_deployment(server)
    workflow = routed_workflow(operator, [deployment])
    eval_set = quality.eval_set_create(
        workflow=workflow,
        name="capitals",
        cases=[{"prompt": "Capital of France?", "expected": "Paris", "scorer": "exact"}],
        user=operator,
    )
    with django_capture_on_commit_callbacks(execute=False):
        run = quality.eval_run_start(eval_set=eval_set, deployment=deployment, user=operator)
    case = eval_set.cases.get()
    _, attacker = _token(make_user(Role.VIEWER))
    # A wrong answer planted under the eval's own key would score the deployment 0 (and demote it).
    server.behaviour.text = "Lyon"
    assert _text(_ask(attacker, workflow, f"eval:{run.pk}:{case.pk}")) == "Lyon"
    server.behaviour.text = "Paris"
    tasks.eval_set_run.apply(args=(run.pk,))
    run.refresh_from_db()
    assert run.state == EvalRun.State.SUCCEEDED
    assert [float(r.score) for r in QualityRecord.objects.filter(eval_run=run)] == [1.0]


@pytest.mark.parametrize(
    ("custom_id", "message"),
    [("c" * 101, "custom_id must be at most 100 characters"), ("a\tb", "custom_id must be printable")],
)
def test_a_batch_line_key_is_checked_as_a_callers_key_with_a_400(
    operator: User, custom_id: str, message: str
) -> None:
    workflow = routed_workflow(operator, [priced_deployment(base_url="http://127.0.0.1:9/v1")])
    line = json.dumps({"custom_id": custom_id, "prompt": "x"})
    response = api_client(operator).post(
        "/api/batch-jobs/", {"workflow": workflow.slug, "input_jsonl": line}, format="json"
    )
    assert response.status_code == 400
    assert message in response.json()["input"][0]
    assert not BatchJob.objects.exists() and not InferenceRequest.objects.exists()
