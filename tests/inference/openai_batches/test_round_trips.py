"""Batches through the SDK: chat, responses and embeddings lines answered as their live endpoints, billed at batch prices; failed lines in the error file."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from billing.models import Unit, UsageRecord
from inference.models import BatchJob
from registry.store.objectstore import default_store
from tests.helpers import ledger_settled
from tests.inference.openai_batches import (
    BATCH_IN,
    BATCH_OUT,
    USAGE,
    chat_lines,
    file_lines,
    jsonl,
    run_batch,
)
from tests.inference.recording_provider import RecordingProvider, chat_answer

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_chat_batch_round_trip_with_the_sdk(
    team_setup: dict[str, Any], provider: RecordingProvider
) -> None:
    client, workflow = team_setup["client"], team_setup["workflow"]
    provider.script.answer = chat_answer("batched answer", usage=USAGE)
    data = jsonl(chat_lines(workflow, 3))

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

    run_batch(created.id)
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

    out = file_lines(client, done.output_file_id)
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
    uploaded = client.files.create(file=("r.jsonl", jsonl(rows)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/responses", completion_window="24h"
    )
    run_batch(batch.id)
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed" and done.output_file_id is not None
    [line] = file_lines(client, done.output_file_id)
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
    uploaded = client.files.create(file=("e.jsonl", jsonl(rows)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    run_batch(batch.id)
    done = client.batches.retrieve(batch.id)
    assert done.request_counts is not None and done.request_counts.completed == 2
    assert done.output_file_id is not None
    out = file_lines(client, done.output_file_id)
    assert [line["custom_id"] for line in out] == ["e0", "e1"]
    assert all(line["response"]["body"]["data"][0]["embedding"] == [0.25, -0.5, 0.125] for line in out)
    assert all(line["response"]["body"]["model"] == workflow.slug for line in out)


def test_failed_lines_go_to_the_error_file_unbilled(
    team_setup: dict[str, Any], provider: RecordingProvider
) -> None:
    client, workflow = team_setup["client"], team_setup["workflow"]
    provider.script.status = 400  # every call is refused by the provider
    uploaded = client.files.create(file=("in.jsonl", jsonl(chat_lines(workflow, 2))), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    run_batch(batch.id)
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed" and done.output_file_id is None
    assert done.request_counts is not None and done.request_counts.failed == 2
    assert done.error_file_id is not None
    errors = file_lines(client, done.error_file_id)
    assert [e["custom_id"] for e in errors] == ["req-0", "req-1"]
    assert all(e["response"] is None and e["error"]["code"] == "provider_error" for e in errors)
    ledger_settled()
    assert not UsageRecord.objects.filter(workflow=workflow).exists()
