"""OpenAI's Files and Batch APIs on the gateway, driven by the official `openai` SDK.

The SDK uploads a JSONL file, creates a batch, polls it and downloads the output and error files;
the job runs as every batch job runs (the Celery task, applied here in the test process; a real
worker runs one in tests/integration/test_batch_jobs.py). The workflow's deployment is a
loopback provider that records each body it gets: the tests check those bodies, the answer
documents in the output file (the live endpoint's, line for line), the ledger at the batch
prices, and who may see which file and batch.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import openai
import pytest
from django.contrib.auth.models import User

from billing.models import Unit, UsageRecord
from inference import tasks
from inference.batch import jobs
from inference.batch.lines import job_prefix
from inference.models import BatchJob, GatewayFile
from inference.router.errors import NoRoute
from registry.auth.roles import Role
from registry.models import Workflow
from registry.services import api_token_create, workflow_update
from registry.store.objectstore import default_store
from tests.factories import make_member, make_price, make_team
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.inference.recording_provider import RecordingProvider, chat_answer

pytestmark = pytest.mark.django_db(transaction=True)

BATCH_IN, BATCH_OUT = Decimal("0.5"), Decimal("1.5")  # half of tests.inference.helpers' prices
USAGE = {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}


@pytest.fixture(autouse=True)
def _own_store(settings: Any, tmp_path: Path) -> None:
    settings.OBJECT_STORE_URL = f"file://{tmp_path / 'objects'}"
    settings.INFERENCE_BATCH_PART_LINES = 2


@pytest.fixture
def team_setup(live_server: Any, provider: RecordingProvider) -> dict[str, Any]:
    """A team's workflow on the recording provider (with batch prices), a key of the team, and
    the SDK client on that key."""
    team = make_team("alpha")
    member = make_member(team, Role.OPERATOR)
    deployment = priced_deployment(base_url=provider.base_url, provider_model_id="provider-model")
    deployment.supports_embeddings = True
    deployment.save()
    make_price(unit=Unit.BATCH_INPUT_TOKENS_1M, unit_price=BATCH_IN, deployment=deployment)
    make_price(unit=Unit.BATCH_OUTPUT_TOKENS_1M, unit_price=BATCH_OUT, deployment=deployment)
    workflow = routed_workflow(member, [deployment], team=team)
    token, raw = api_token_create(user=member, name="batches", team=team)
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0)
    return {"team": team, "member": member, "workflow": workflow, "token": token, "client": client}


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _chat_lines(workflow: Workflow, n: int) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": workflow.slug,
                "messages": [{"role": "user", "content": f"hi {i}"}],
                "max_tokens": 50,
            },
        }
        for i in range(n)
    ]


def _run(batch_id: str) -> BatchJob:
    """Run the job the way its Celery task does (the message the API queued is left alone)."""
    job = BatchJob.objects.get(pk=int(batch_id.removeprefix("batch_sy")))
    tasks.batch_job_run.apply(args=(job.pk,))
    job.refresh_from_db()
    return job


def _lines(client: openai.OpenAI, file_id: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def test_a_chat_batch_round_trip_with_the_sdk(
    team_setup: dict[str, Any], provider: RecordingProvider
) -> None:
    client, workflow = team_setup["client"], team_setup["workflow"]
    provider.script.answer = chat_answer("batched answer", usage=USAGE)
    data = _jsonl(_chat_lines(workflow, 3))

    uploaded = client.files.create(file=("input.jsonl", data, "application/jsonl"), purpose="batch")
    assert (uploaded.object, uploaded.purpose, uploaded.filename, uploaded.bytes) == (
        "file",
        "batch",
        "input.jsonl",
        len(data),
    )
    assert client.files.retrieve(uploaded.id).id == uploaded.id
    assert [f.id for f in client.files.list(purpose="batch")] == [uploaded.id]
    assert client.files.content(uploaded.id).content == data

    created = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"run": "nightly"},
    )
    assert (created.status, created.endpoint, created.input_file_id) == (
        "in_progress",
        "/v1/chat/completions",
        uploaded.id,
    )
    assert created.request_counts is not None and created.request_counts.total == 3
    assert created.metadata == {"run": "nightly"}
    assert provider.script.calls() == 0  # nothing is called until a worker runs the job

    _run(created.id)
    done = client.batches.retrieve(created.id)
    assert done.status == "completed" and done.completed_at is not None
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 0)
    assert done.error_file_id is None and done.output_file_id is not None
    assert [b.id for b in client.batches.list()] == [created.id]

    # Each line's body reached the provider as the live endpoint would send it.
    sent = sorted(body["messages"][0]["content"] for _, body in provider.script.bodies)
    assert sent == ["hi 0", "hi 1", "hi 2"]
    assert {body["model"] for _, body in provider.script.bodies} == {"provider-model"}
    assert {body["max_tokens"] for _, body in provider.script.bodies} == {50}

    out = _lines(client, done.output_file_id)
    assert [line["custom_id"] for line in out] == ["req-0", "req-1", "req-2"]
    for line in out:
        assert line["error"] is None and line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == workflow.slug
        assert body["choices"][0]["message"]["content"] == "batched answer"
        assert body["usage"] == USAGE
    output_file = client.files.retrieve(done.output_file_id)
    assert output_file.purpose == "batch_output"
    assert output_file.bytes == len(client.files.content(done.output_file_id).content)

    # Billed once per line, at the batch prices: 1000 in, 200 out each.
    ledger_settled()
    rows = UsageRecord.objects.filter(workflow=workflow)
    assert rows.count() == 6
    assert {r.unit for r in rows} == {Unit.BATCH_INPUT_TOKENS_1M, Unit.BATCH_OUTPUT_TOKENS_1M}
    expected = 3 * (Decimal(1000) * BATCH_IN + Decimal(200) * BATCH_OUT) / Decimal(1_000_000)
    assert sum(r.amount for r in rows) == expected
    # The parts (copies of the answers) are gone: the output file is the one copy.
    job = BatchJob.objects.get(pk=int(created.id.removeprefix("batch_sy")))
    assert [k for k in default_store().list("inference/batch/jobs/") if "/part-" in k] == []
    assert job.done == 3


def test_a_responses_and_an_embeddings_batch_answer_as_their_live_endpoints(
    team_setup: dict[str, Any], provider: RecordingProvider
) -> None:
    client, workflow = team_setup["client"], team_setup["workflow"]
    provider.script.answer = chat_answer("translated", usage=USAGE)
    rows = [
        {
            "custom_id": "r1",
            "method": "POST",
            "url": "/v1/responses",
            "body": {
                "model": workflow.slug,
                "input": "hello",
                "instructions": "be brief",
                "max_output_tokens": 40,
            },
        }
    ]
    uploaded = client.files.create(file=("r.jsonl", _jsonl(rows)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/responses", completion_window="24h"
    )
    _run(batch.id)
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed" and done.output_file_id is not None
    [line] = _lines(client, done.output_file_id)
    body = line["response"]["body"]
    assert body["object"] == "response" and body["status"] == "completed"
    assert body["output"][0]["content"][0]["text"] == "translated"
    assert body["usage"]["input_tokens"] == 1000 and body["usage"]["output_tokens"] == 200
    # Translated to chat for the chat-only provider, as /v1/responses does live.
    assert provider.script.last_body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
    ]
    assert provider.script.last_body["max_completion_tokens"] == 40

    rows = [
        {
            "custom_id": f"e{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": workflow.slug, "input": [f"text {i}"]},
        }
        for i in range(2)
    ]
    uploaded = client.files.create(file=("e.jsonl", _jsonl(rows)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    _run(batch.id)
    done = client.batches.retrieve(batch.id)
    assert done.request_counts is not None and done.request_counts.completed == 2
    assert done.output_file_id is not None
    out = _lines(client, done.output_file_id)
    assert [line["custom_id"] for line in out] == ["e0", "e1"]
    assert all(line["response"]["body"]["data"][0]["embedding"] == [0.25, -0.5, 0.125] for line in out)
    assert all(line["response"]["body"]["model"] == workflow.slug for line in out)


def test_failed_lines_go_to_the_error_file_unbilled(
    team_setup: dict[str, Any], provider: RecordingProvider
) -> None:
    client, workflow = team_setup["client"], team_setup["workflow"]
    provider.script.status = 400  # every call is refused by the provider
    uploaded = client.files.create(file=("in.jsonl", _jsonl(_chat_lines(workflow, 2))), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    _run(batch.id)
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed" and done.output_file_id is None
    assert done.request_counts is not None and done.request_counts.failed == 2
    assert done.error_file_id is not None
    errors = _lines(client, done.error_file_id)
    assert [e["custom_id"] for e in errors] == ["req-0", "req-1"]
    assert all(e["response"] is None and e["error"]["code"] == "provider_error" for e in errors)
    ledger_settled()
    assert not UsageRecord.objects.filter(workflow=workflow).exists()


def _status_of(exc: pytest.ExceptionInfo[openai.APIStatusError]) -> tuple[int, Any]:
    body = exc.value.body
    return exc.value.status_code, body.get("param") if isinstance(body, dict) else None


@pytest.mark.parametrize(
    ("rows", "endpoint", "status", "param", "says"),
    [
        # A line of another API than the batch's endpoint.
        ("chat", "/v1/responses", 400, "input_file_id", "url must be the batch's endpoint"),
        # Two models in one batch.
        ("two-models", "/v1/chat/completions", 400, "input_file_id", "same model"),
        # A model the key's team does not have: as if it did not exist.
        ("other-model", "/v1/chat/completions", 404, None, "does not exist"),
    ],
)
def test_a_batch_is_refused_before_it_is_queued(
    team_setup: dict[str, Any], rows: str, endpoint: str, status: int, param: str | None, says: str
) -> None:
    client, workflow = team_setup["client"], team_setup["workflow"]
    lines = _chat_lines(workflow, 2)
    if rows == "two-models":
        lines[1]["body"]["model"] = "another-workflow"
    if rows == "other-model":
        other = routed_workflow(team_setup["member"], [], team=make_team("beta"))
        for line in lines:
            line["body"]["model"] = other.slug
    uploaded = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
    with pytest.raises(openai.APIStatusError) as exc:
        client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h")  # type: ignore[arg-type]
    assert _status_of(exc) == (status, param)
    assert says in exc.value.message
    assert not BatchJob.objects.exists()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (
            b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}}\n',
            "line 1",
        ),
        (b"not json\n", "line 1: the line is not valid JSON"),
        (
            b'{"custom_id": "a", "method": "GET", "url": "/v1/chat/completions", "body": {}}\n',
            "method must be POST",
        ),
        (b'{"custom_id": "a", "method": "POST", "url": "/v1/images", "body": {}}\n', "url must be one of"),
        (b"\xff\xfe\n", "not UTF-8"),
        (b"\n\n", "no lines"),
    ],
)
def test_an_upload_that_is_not_a_batch_input_is_refused_and_not_kept(
    team_setup: dict[str, Any], content: bytes, says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        team_setup["client"].files.create(file=("bad.jsonl", content), purpose="batch")
    assert says in exc.value.message and _status_of(exc) == (400, "file")
    assert not GatewayFile.objects.exists()


def test_a_message_with_a_unicode_line_separator_is_one_line(team_setup: dict[str, Any]) -> None:
    """JSON strings may hold U+2028 and U+0085 raw; a JSONL line ends at \\n only."""
    lines = _chat_lines(team_setup["workflow"], 1)
    lines[0]["body"]["messages"][0]["content"] = "one\u2028two\x85three"
    data = json.dumps(lines[0], ensure_ascii=False).encode() + b"\n"
    uploaded = team_setup["client"].files.create(file=("u.jsonl", data), purpose="batch")
    batch = team_setup["client"].batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.request_counts is not None and batch.request_counts.total == 1


def test_files_and_batches_are_seen_only_by_their_team_and_workflow(
    team_setup: dict[str, Any], live_server: Any, provider: RecordingProvider
) -> None:
    client, workflow, member = team_setup["client"], team_setup["workflow"], team_setup["member"]
    uploaded = client.files.create(file=("in.jsonl", _jsonl(_chat_lines(workflow, 1))), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    _run(batch.id)
    output_id = client.batches.retrieve(batch.id).output_file_id
    assert output_id is not None

    def client_of(user: User, **key: Any) -> openai.OpenAI:
        _, raw = api_token_create(user=user, name="other", **key)
        return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0)

    beta = make_team("beta")
    outsider = client_of(make_member(beta, Role.ADMIN), team=beta)
    # Another team's key: every id answers as one that does not exist.
    for call in (
        lambda: outsider.files.retrieve(uploaded.id),
        lambda: outsider.files.content(output_id),
        lambda: outsider.files.delete(uploaded.id),
        lambda: outsider.batches.retrieve(batch.id),
        lambda: outsider.batches.cancel(batch.id),
        lambda: outsider.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert outsider.files.list().data == [] and outsider.batches.list().data == []

    # A key of the same team limited to another workflow sees neither the other key's upload
    # (its prompts) nor the batch or its output; its own uploads it does.
    sibling = routed_workflow(member, [], team=team_setup["team"])
    scoped = client_of(member, team=team_setup["team"], workflows=[sibling])
    assert scoped.files.list().data == []
    with pytest.raises(openai.NotFoundError):
        scoped.files.content(uploaded.id)
    own = scoped.files.create(file=("own.jsonl", _jsonl(_chat_lines(sibling, 1))), purpose="batch")
    assert {f.id for f in scoped.files.list()} == {own.id}
    assert own.id in {f.id for f in client.files.list()}  # the unscoped team key sees the team's files
    with pytest.raises(openai.NotFoundError):
        scoped.files.content(output_id)
    with pytest.raises(openai.NotFoundError):
        scoped.batches.retrieve(batch.id)
    assert scoped.batches.list().data == []

    # Ids of no shape answer 404 as well, never a 500.
    for bad in ("file-sy0", "file-sy99999999999999999999", "file-abc", "x" * 128):
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(bad)


def test_cancel_and_delete(team_setup: dict[str, Any]) -> None:
    client, workflow = team_setup["client"], team_setup["workflow"]
    uploaded = client.files.create(file=("in.jsonl", _jsonl(_chat_lines(workflow, 2))), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    # Its input cannot be deleted while the batch may still read it.
    with pytest.raises(openai.ConflictError):
        client.files.delete(uploaded.id)
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status == "cancelled" and cancelled.cancelled_at is not None
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)
    key = GatewayFile.objects.get().key
    deleted = client.files.delete(uploaded.id)
    assert deleted.deleted is True and deleted.id == uploaded.id
    assert not GatewayFile.objects.exists() and default_store().list(key) == []
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)


def test_bad_batch_parameters_name_the_field(team_setup: dict[str, Any]) -> None:
    client, workflow = team_setup["client"], team_setup["workflow"]
    uploaded = client.files.create(file=("in.jsonl", _jsonl(_chat_lines(workflow, 1))), purpose="batch")
    cases = [
        ({"endpoint": "/v1/images/generations"}, "endpoint"),
        ({"completion_window": "48h"}, "completion_window"),
        ({"metadata": {"k": 1}}, "metadata.k"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"input_file_id": 7}, "input_file_id"),
        ({"surprise": True}, "surprise"),
    ]
    for change, param in cases:
        body = {
            "input_file_id": uploaded.id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            **change,
        }
        with pytest.raises(openai.BadRequestError) as exc:
            client.post("/batches", body=body, cast_to=dict)
        assert _status_of(exc) == (400, param), change
    for query, param in (({"limit": "0"}, "limit"), ({"order": "up"}, "order"), ({"after": "nope"}, "after")):
        with pytest.raises(openai.BadRequestError) as exc:
            client.get("/files", options={"params": query}, cast_to=dict)
        assert exc.value.status_code == 400 and param in exc.value.message
    with pytest.raises(openai.BadRequestError) as exc:
        client.files.create(file=("in.jsonl", b"{}"), purpose="assistants")
    assert _status_of(exc) == (400, "purpose")
    assert not BatchJob.objects.exists()


def test_a_workflow_moved_to_another_team_takes_its_outputs_along(
    team_setup: dict[str, Any], live_server: Any
) -> None:
    client, workflow = team_setup["client"], team_setup["workflow"]
    uploaded = client.files.create(file=("in.jsonl", _jsonl(_chat_lines(workflow, 1))), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    _run(batch.id)
    output_id = client.batches.retrieve(batch.id).output_file_id
    assert output_id is not None
    beta = make_team("beta")
    workflow_update(workflow, team=beta)
    with pytest.raises(openai.NotFoundError):  # the old team no longer reads the answers
        client.files.content(output_id)
    _, raw = api_token_create(user=make_member(beta, Role.OPERATOR), name="beta", team=beta)
    beta_client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0)
    assert len(_lines(beta_client, output_id)) == 1


def test_a_file_whose_object_is_gone_answers_404_not_500(team_setup: dict[str, Any]) -> None:
    client, workflow = team_setup["client"], team_setup["workflow"]
    uploaded = client.files.create(file=("in.jsonl", _jsonl(_chat_lines(workflow, 1))), purpose="batch")
    default_store().delete(GatewayFile.objects.get().key)
    with pytest.raises(openai.NotFoundError):
        client.files.content(uploaded.id)
    with pytest.raises(openai.BadRequestError) as exc:
        client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert "gone" in exc.value.message and not BatchJob.objects.exists()


def test_a_team_that_still_owns_files_is_kept_with_a_clear_error(team_setup: dict[str, Any]) -> None:
    from registry.services.teams import TeamError, team_delete

    client, workflow = team_setup["client"], team_setup["workflow"]
    client.files.create(file=("in.jsonl", _jsonl(_chat_lines(workflow, 1))), purpose="batch")
    workflow.policy_versions.all().delete()
    workflow.delete()
    team_setup["token"].delete()
    with pytest.raises(TeamError, match="1 /v1 files"):
        team_delete(team=team_setup["team"])


def _five_line_batch(team_setup: dict[str, Any], provider: RecordingProvider) -> tuple[openai.OpenAI, Any]:
    client, workflow = team_setup["client"], team_setup["workflow"]
    provider.script.answer = chat_answer("ok", usage=USAGE)
    uploaded = client.files.create(file=("in.jsonl", _jsonl(_chat_lines(workflow, 5))), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return client, batch


@pytest.mark.parametrize("ending", ["cancelled", "failed"])
def test_a_batch_that_ends_part_way_keeps_the_answers_of_the_lines_it_did(
    team_setup: dict[str, Any], provider: RecordingProvider, monkeypatch: pytest.MonkeyPatch, ending: str
) -> None:
    """Cancelled while its third line is answered, or failed at its fourth (no route): the lines
    done are in its output file, as OpenAI's batches keep them, and no part object is left."""
    client, batch = _five_line_batch(team_setup, provider)
    real_line = jobs._run_line
    ran: list[int] = []

    def ending_line(job: BatchJob, line: Any, lease: Any = None) -> dict[str, Any]:
        if ending == "failed" and len(ran) == 3:
            raise NoRoute("every deployment is gone")
        record = real_line(job, line, lease)
        ran.append(line.number)
        if ending == "cancelled" and len(ran) == 3:
            client.batches.cancel(batch.id)  # arrives while the runner is on its third line
        return record

    monkeypatch.setattr(jobs, "_run_line", ending_line)
    job = _run(batch.id)
    assert job.state == ending and len(ran) == 3 and provider.script.calls() == 3
    done = client.batches.retrieve(batch.id)
    assert done.status == ending and done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 0)
    assert done.output_file_id is not None and done.error_file_id is None
    answers = _lines(client, done.output_file_id)
    assert [a["custom_id"] for a in answers] == ["req-0", "req-1", "req-2"]
    assert all(a["response"]["status_code"] == 200 for a in answers)
    assert not [k for k in default_store().list(job_prefix(job)) if "/part-" in k]
    # Once: the resume sweep finds nothing more to write for it.
    assert tasks.batch_jobs_resume.apply().get() == 0
    assert GatewayFile.objects.filter(purpose=GatewayFile.Purpose.BATCH_OUTPUT).count() == 1


class _Killed(BaseException):
    """The worker process dies mid-job: no handler runs."""


def test_a_batch_cancelled_after_its_runner_died_gets_its_answers_from_the_resume_sweep(
    team_setup: dict[str, Any], provider: RecordingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, batch = _five_line_batch(team_setup, provider)
    real_line = jobs._run_line
    ran: list[int] = []

    def dying_line(job: BatchJob, line: Any, lease: Any = None) -> dict[str, Any]:
        if len(ran) == 3:
            raise _Killed
        ran.append(line.number)
        return real_line(job, line, lease)

    monkeypatch.setattr(jobs, "_run_line", dying_line)
    with pytest.raises(_Killed):
        _run(batch.id)
    assert client.batches.cancel(batch.id).status == "cancelled"
    job = BatchJob.objects.get(pk=int(batch.id.removeprefix("batch_sy")))
    assert job.output_file_id is None  # no runner left to write it
    BatchJob.objects.filter(pk=job.pk).update(updated_at=job.updated_at - jobs.stale_after() * 2)
    tasks.batch_jobs_resume.apply()
    done = client.batches.retrieve(batch.id)
    # The first part (lines 1 and 2) was written before the worker died; line 3's answer was
    # still in its memory (its request row and ledger rows are kept, billed once).
    assert done.output_file_id is not None
    assert [a["custom_id"] for a in _lines(client, done.output_file_id)] == ["req-0", "req-1"]
    assert not [k for k in default_store().list(job_prefix(job)) if "/part-" in k]


def test_the_runner_reads_its_input_as_a_stream_and_fails_cleanly_when_it_is_gone(
    team_setup: dict[str, Any], provider: RecordingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, workflow = team_setup["client"], team_setup["workflow"]
    provider.script.answer = chat_answer("ok", usage=USAGE)
    uploaded = client.files.create(file=("in.jsonl", _jsonl(_chat_lines(workflow, 5))), purpose="batch")
    input_key = GatewayFile.objects.get().key
    store_class = type(default_store())
    real_get = store_class.get

    def no_whole_input(self: Any, key: str) -> bytes:
        assert key != input_key, "the runner read the whole input at once"
        return real_get(self, key)

    monkeypatch.setattr(store_class, "get", no_whole_input)
    first = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert _run(first.id).state == BatchJob.State.SUCCEEDED and provider.script.calls() == 5

    second = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    default_store().delete(input_key)  # gone from the store under the job (an operator's mistake)
    failed = _run(second.id)
    assert failed.state == BatchJob.State.FAILED and failed.error.startswith("input unreadable: ")
    assert provider.script.calls() == 5
