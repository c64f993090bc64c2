"""Opt-in prompt retention: kept only for workflows that opted in, with their expiry, purged by
beat, deleted on opt-out, and found nowhere (database or object store) for the others."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.utils import timezone

from bench.mockprovider import MockProviderServer
from inference import tasks
from inference.batch.jobs import batch_job_create, batch_job_execute
from inference.models import BatchJob, InferenceRequest, RetainedPrompt
from registry.models import Workflow
from registry.services import api_token_create
from registry.store.objectstore import default_store
from tests.factories import api_client
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow

Start = Callable[..., MockProviderServer]


@pytest.fixture(autouse=True)
def _own_store(settings: Any, tmp_path: Path) -> None:
    settings.OBJECT_STORE_URL = f"file://{tmp_path / 'objects'}"


def _client(user: User) -> Client:
    _, raw = api_token_create(user=user, name="gateway")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def _post(client: Client, path: str, body: dict[str, Any], **headers: Any) -> Any:
    return client.post(path, json.dumps(body), content_type="application/json", **headers)


def _traffic(client: Client, workflow: Workflow, marker: str) -> None:
    """A chat, a streamed chat, a completion and a chat with an Idempotency-Key, each carrying
    `marker` in its prompt."""
    chat = {"model": workflow.slug, "messages": [{"role": "user", "content": f"say {marker}"}]}
    assert (
        _post(client, "/v1/chat/completions", {**chat, "temperature": 0.2, "max_tokens": 9}).status_code
        == 200
    )
    streamed = _post(client, "/v1/chat/completions", {**chat, "stream": True})
    assert streamed.status_code == 200
    b"".join(streamed.streaming_content)  # the request is recorded when the stream ends
    completion = {"model": workflow.slug, "prompt": f"complete {marker}"}
    assert _post(client, "/v1/completions", completion).status_code == 200
    keyed = _post(client, "/v1/chat/completions", chat, HTTP_IDEMPOTENCY_KEY=f"k-{marker}")
    assert keyed.status_code == 200


@pytest.mark.django_db
def test_an_opted_in_workflow_keeps_chat_stream_and_completion_requests_until_their_expiry(
    operator: User, mock_provider: Start
) -> None:
    workflow = routed_workflow(
        operator,
        [priced_deployment(mock_provider(text="pong"))],
        retain_prompts=True,
        prompt_retention_days=7,
    )
    _traffic(_client(operator), workflow, "m1")
    kept = list(RetainedPrompt.objects.filter(workflow=workflow).order_by("pk"))
    assert len(kept) == 4
    first = kept[0]
    assert first.request == {
        "messages": [{"role": "user", "content": "say m1"}],
        "temperature": 0.2,
        "max_tokens": 9,
    }
    assert kept[1].request == {"messages": [{"role": "user", "content": "say m1"}]}  # the stream
    assert kept[2].request == {"prompt": "complete m1"} and kept[2].endpoint == "completion"
    assert all(k.response_text == "pong" for k in kept)
    assert all(k.expires_at == k.created_at + timedelta(days=7) for k in kept)
    assert {k.inference_request_id for k in kept} == set(
        InferenceRequest.objects.filter(workflow=workflow).values_list("pk", flat=True)
    )


@pytest.mark.django_db
def test_the_purge_deletes_expired_kept_requests_and_replay_objects_that_hold_them(
    operator: User, mock_provider: Start
) -> None:
    server = mock_provider(text="pong")
    workflow = routed_workflow(
        operator, [priced_deployment(server)], retain_prompts=True, prompt_retention_days=1
    )
    _traffic(_client(operator), workflow, "m2")
    assert RetainedPrompt.objects.filter(workflow=workflow).count() == 4
    now = timezone.now()
    job = batch_job_create(
        workflow=workflow,
        user=operator,
        input_jsonl=json.dumps({"custom_id": "a", "messages": [{"role": "user", "content": "kept m2"}]})
        + "\n",
        holds_prompts_until=now + timedelta(days=1),
        enqueue=False,
    )
    batch_job_execute(job_id=job.pk)
    job.refresh_from_db()
    assert job.state == BatchJob.State.SUCCEEDED
    store = default_store()
    assert store.list(f"inference/batch/jobs/{job.pk}-") and store.get(job.input_uri)

    # Not yet expired: nothing goes.
    assert tasks.retained_prompts_purge.apply().get() == {
        "retained_prompts": 0,
        "stored_responses": 0,
        "batch_jobs_scrubbed": 0,
    }
    later = now + timedelta(days=1, minutes=1)
    assert retained_purge(later) == {"retained_prompts": 4, "stored_responses": 0, "batch_jobs_scrubbed": 1}
    assert not RetainedPrompt.objects.filter(workflow=workflow).exists()
    assert store.list(f"inference/batch/jobs/{job.pk}-") == [] and not store.list("inference/batch/inputs/")
    job.refresh_from_db()
    assert job.holds_prompts_until is None and job.done == 1  # the row and its counters stay
    line = InferenceRequest.objects.get(client_request_id=f"batch:{job.pk}:a")
    assert line.response_text == "" and line.cost > 0


def retained_purge(now: Any) -> dict[str, int]:
    from inference.retention import retained_prompts_purge

    return retained_prompts_purge(now=now)


@pytest.mark.django_db
def test_opting_out_deletes_kept_requests_at_once_and_keeps_no_more(
    operator: User, mock_provider: Start
) -> None:
    workflow = routed_workflow(
        operator,
        [priced_deployment(mock_provider(text="pong"))],
        retain_prompts=True,
        prompt_retention_days=30,
    )
    gateway = _client(operator)
    _traffic(gateway, workflow, "m3")
    assert RetainedPrompt.objects.filter(workflow=workflow).count() == 4

    response = api_client(operator).patch(
        f"/api/workflows/{workflow.slug}/", {"retain_prompts": False}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["retain_prompts"] is False
    assert not RetainedPrompt.objects.filter(workflow=workflow).exists()
    # The gateway's cached workflow row may still say "keep": the fold reads the setting afresh.
    _traffic(gateway, workflow, "m4")
    assert not RetainedPrompt.objects.filter(workflow=workflow).exists()


def _tables_holding(marker: str) -> list[str]:
    """Every text, varchar and json column of every table in the database that holds `marker`."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'public' "
            "AND data_type IN ('text', 'character varying', 'json', 'jsonb', 'character')"
        )
        columns = cursor.fetchall()
        found = []
        for table, column in columns:
            q = connection.ops.quote_name
            cursor.execute(
                f"SELECT count(*) FROM {q(table)} WHERE {q(column)}::text LIKE %s",  # noqa: S608 (quoted names)
                [f"%{marker}%"],
            )
            if cursor.fetchone()[0]:
                found.append(f"{table}.{column}")
    return found


def _objects_holding(marker: str, root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and marker.encode() in p.read_bytes()]


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres  # scans PostgreSQL's information_schema
def test_no_prompt_of_a_workflow_that_did_not_opt_in_is_kept_in_any_table_or_object(
    operator: User, mock_provider: Start, settings: Any, tmp_path: Path
) -> None:
    # Journaled recording, as in production: the journal entry is a place a prompt could hide.
    settings.INFERENCE_RECORDING = "journal"
    server = mock_provider(text="pong")
    plain = routed_workflow(operator, [priced_deployment(server)])
    kept = routed_workflow(
        operator, [priced_deployment(server)], retain_prompts=True, prompt_retention_days=3
    )
    gateway = _client(operator)
    secret, control = f"secret-{uuid.uuid4().hex}", f"control-{uuid.uuid4().hex}"
    _traffic(gateway, plain, secret)
    _traffic(gateway, kept, control)
    ledger_settled()
    assert InferenceRequest.objects.filter(workflow=plain).count() == 4

    assert _tables_holding(secret) == []
    assert _objects_holding(secret, tmp_path) == []
    # The scan finds what is there: the opted-in workflow's prompts, in the kept table only.
    assert _tables_holding(control) == ["inference_retainedprompt.request"]
    assert RetainedPrompt.objects.filter(workflow=kept).count() == 4
    assert not RetainedPrompt.objects.filter(workflow=plain).exists()


@pytest.mark.django_db
def test_the_workflow_api_requires_a_retention_period_of_1_to_365_days_when_keeping(operator: User) -> None:
    client = api_client(operator)
    deployment = priced_deployment(base_url="http://127.0.0.1:9/v1")
    body = {"slug": "kept-wf", "route": {"deployments": [deployment.slug]}, "retain_prompts": True}
    missing = client.post("/api/workflows/", body, format="json")
    assert missing.status_code == 400
    assert "prompt_retention_days" in missing.json()
    for days in (0, 366):
        out = client.post("/api/workflows/", {**body, "prompt_retention_days": days}, format="json")
        assert out.status_code == 400 and "prompt_retention_days" in out.json(), out.content
    made = client.post("/api/workflows/", {**body, "prompt_retention_days": 30}, format="json")
    assert made.status_code == 201, made.content
    assert (made.json()["retain_prompts"], made.json()["prompt_retention_days"]) == (True, 30)

    plain = client.post(
        "/api/workflows/", {"slug": "plain-wf", "route": {"deployments": [deployment.slug]}}, format="json"
    )
    assert plain.status_code == 201 and plain.json()["retain_prompts"] is False
    refused = client.patch("/api/workflows/plain-wf/", {"retain_prompts": True}, format="json")
    assert refused.status_code == 400 and "prompt_retention_days" in refused.json()
    assert Workflow.objects.get(slug="plain-wf").retain_prompts is False
    ok = client.patch(
        "/api/workflows/plain-wf/", {"retain_prompts": True, "prompt_retention_days": 1}, format="json"
    )
    assert ok.status_code == 200 and Workflow.objects.get(slug="plain-wf").prompt_retention_days == 1


@pytest.mark.django_db
def test_the_workflow_form_refuses_keeping_prompts_without_a_retention_period(admin_user: User) -> None:
    deployment = priced_deployment(base_url="http://127.0.0.1:9/v1")
    client = Client()
    client.force_login(admin_user)
    form = {"slug": "form-wf", "deployments": [deployment.pk], "retain_prompts": "on"}
    response = client.post("/workflows/new/", form)
    assert response.status_code in (200, 400)
    assert b"required when prompts are kept" in response.content
    assert not Workflow.objects.filter(slug="form-wf").exists()
    response = client.post("/workflows/new/", {**form, "prompt_retention_days": "14"})
    assert response.status_code == 302
    made = Workflow.objects.get(slug="form-wf")
    assert (made.retain_prompts, made.prompt_retention_days) == (True, 14)


@pytest.mark.django_db
def test_the_workflow_page_turns_retention_on_with_a_period_and_off_deleting_what_was_kept(
    operator: User, mock_provider: Start
) -> None:
    workflow = routed_workflow(operator, [priced_deployment(mock_provider(text="pong"))])
    page = Client()
    page.force_login(operator)
    url = f"/workflows/{workflow.slug}/"
    assert b"No prompt or answer of this workflow is kept" in page.get(url).content
    refused = page.post(url, {"action": "retention", "retain_prompts": "on"})
    assert refused.status_code == 400 and b"required when prompts are kept" in refused.content
    assert (
        page.post(
            url, {"action": "retention", "retain_prompts": "on", "prompt_retention_days": "400"}
        ).status_code
        == 400
    )
    assert (
        page.post(
            url, {"action": "retention", "retain_prompts": "on", "prompt_retention_days": "5"}
        ).status_code
        == 302
    )
    workflow.refresh_from_db()
    assert (workflow.retain_prompts, workflow.prompt_retention_days) == (True, 5)
    _traffic(_client(operator), workflow, "m5")
    assert RetainedPrompt.objects.filter(workflow=workflow).count() == 4
    assert page.post(url, {"action": "retention"}).status_code == 302
    workflow.refresh_from_db()
    assert workflow.retain_prompts is False
    assert not RetainedPrompt.objects.filter(workflow=workflow).exists()


@pytest.mark.django_db
@pytest.mark.postgres  # the journal is PostgreSQL's recording; the entry is edited with its JSON operators
def test_opting_out_drops_the_kept_input_from_a_journal_entry_whose_fold_failed(operator: User) -> None:
    deployment = priced_deployment(base_url="http://127.0.0.1:9/v1")
    workflow = routed_workflow(operator, [deployment], retain_prompts=True, prompt_retention_days=3)
    entry = {"v": 1, "attempts": [], "billed": [], "kept": {"request": {"prompt": "secret"}}, "error": "boom"}
    row = InferenceRequest.objects.create(workflow=workflow, status="succeeded", ledger_pending=entry)
    api_client(operator).patch(f"/api/workflows/{workflow.slug}/", {"retain_prompts": False}, format="json")
    row.refresh_from_db()
    assert row.ledger_pending is not None
    assert "kept" not in row.ledger_pending and row.ledger_pending["error"] == "boom"
