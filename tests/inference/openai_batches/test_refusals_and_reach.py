"""Batches and files refused, cancelled and deleted, and seen only by their team and workflow."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from django.contrib.auth.models import User

from inference.models import BatchJob, GatewayFile
from registry.auth.roles import Role
from registry.services import api_token_create, workflow_update
from registry.store.objectstore import default_store
from tests.factories import make_member, make_team
from tests.inference.helpers import routed_workflow
from tests.inference.openai_batches import (
    chat_lines,
    file_lines,
    jsonl,
    run_batch,
)
from tests.inference.recording_provider import RecordingProvider

pytestmark = pytest.mark.django_db(transaction=True)


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
    lines = chat_lines(workflow, 2)
    if rows == "two-models":
        lines[1]["body"]["model"] = "another-workflow"
    if rows == "other-model":
        other = routed_workflow(team_setup["member"], [], team=make_team("beta"))
        for line in lines:
            line["body"]["model"] = other.slug
    uploaded = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
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
    lines = chat_lines(team_setup["workflow"], 1)
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
    uploaded = client.files.create(file=("in.jsonl", jsonl(chat_lines(workflow, 1))), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    run_batch(batch.id)
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
    own = scoped.files.create(file=("own.jsonl", jsonl(chat_lines(sibling, 1))), purpose="batch")
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
    uploaded = client.files.create(file=("in.jsonl", jsonl(chat_lines(workflow, 2))), purpose="batch")
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
    uploaded = client.files.create(file=("in.jsonl", jsonl(chat_lines(workflow, 1))), purpose="batch")
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
    uploaded = client.files.create(file=("in.jsonl", jsonl(chat_lines(workflow, 1))), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    run_batch(batch.id)
    output_id = client.batches.retrieve(batch.id).output_file_id
    assert output_id is not None
    beta = make_team("beta")
    workflow_update(workflow, team=beta)
    with pytest.raises(openai.NotFoundError):  # the old team no longer reads the answers
        client.files.content(output_id)
    _, raw = api_token_create(user=make_member(beta, Role.OPERATOR), name="beta", team=beta)
    beta_client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0)
    assert len(file_lines(beta_client, output_id)) == 1


def test_a_file_whose_object_is_gone_answers_404_not_500(team_setup: dict[str, Any]) -> None:
    client, workflow = team_setup["client"], team_setup["workflow"]
    uploaded = client.files.create(file=("in.jsonl", jsonl(chat_lines(workflow, 1))), purpose="batch")
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
    client.files.create(file=("in.jsonl", jsonl(chat_lines(workflow, 1))), purpose="batch")
    workflow.policy_versions.all().delete()
    workflow.delete()
    team_setup["token"].delete()
    with pytest.raises(TeamError, match="1 /v1 files"):
        team_delete(team=team_setup["team"])
