"""Batches that end part way keep their answers; the runner reads its input as a stream."""

from __future__ import annotations

from typing import Any

import pytest

from inference import tasks
from inference.batch import jobs
from inference.batch.lines import job_prefix
from inference.models import BatchJob, GatewayFile
from inference.router.errors import NoRoute
from registry.store.objectstore import default_store
from tests.inference.openai_batches import (
    USAGE,
    chat_lines,
    file_lines,
    five_line_batch,
    jsonl,
    run_batch,
)
from tests.inference.recording_provider import RecordingProvider, chat_answer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("ending", ["cancelled", "failed"])
def test_a_batch_that_ends_part_way_keeps_the_answers_of_the_lines_it_did(
    team_setup: dict[str, Any], provider: RecordingProvider, monkeypatch: pytest.MonkeyPatch, ending: str
) -> None:
    """Cancelled while its third line is answered, or failed at its fourth (no route): the lines
    done are in its output file, as OpenAI's batches keep them, and no part object is left."""
    client, batch = five_line_batch(team_setup, provider)
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
    job = run_batch(batch.id)
    assert job.state == ending and len(ran) == 3 and provider.script.calls() == 3
    done = client.batches.retrieve(batch.id)
    assert done.status == ending and done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 0)
    assert done.output_file_id is not None and done.error_file_id is None
    answers = file_lines(client, done.output_file_id)
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
    client, batch = five_line_batch(team_setup, provider)
    real_line = jobs._run_line
    ran: list[int] = []

    def dying_line(job: BatchJob, line: Any, lease: Any = None) -> dict[str, Any]:
        if len(ran) == 3:
            raise _Killed
        ran.append(line.number)
        return real_line(job, line, lease)

    monkeypatch.setattr(jobs, "_run_line", dying_line)
    with pytest.raises(_Killed):
        run_batch(batch.id)
    assert client.batches.cancel(batch.id).status == "cancelled"
    job = BatchJob.objects.get(pk=int(batch.id.removeprefix("batch_sy")))
    assert job.output_file_id is None  # no runner left to write it
    BatchJob.objects.filter(pk=job.pk).update(updated_at=job.updated_at - jobs.stale_after() * 2)
    tasks.batch_jobs_resume.apply()
    done = client.batches.retrieve(batch.id)
    # The first part (lines 1 and 2) was written before the worker died; line 3's answer was
    # still in its memory (its request row and ledger rows are kept, billed once).
    assert done.output_file_id is not None
    assert [a["custom_id"] for a in file_lines(client, done.output_file_id)] == ["req-0", "req-1"]
    assert not [k for k in default_store().list(job_prefix(job)) if "/part-" in k]


def test_the_runner_reads_its_input_as_a_stream_and_fails_cleanly_when_it_is_gone(
    team_setup: dict[str, Any], provider: RecordingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, workflow = team_setup["client"], team_setup["workflow"]
    provider.script.answer = chat_answer("ok", usage=USAGE)
    uploaded = client.files.create(file=("in.jsonl", jsonl(chat_lines(workflow, 5))), purpose="batch")
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
    assert run_batch(first.id).state == BatchJob.State.SUCCEEDED and provider.script.calls() == 5

    second = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    default_store().delete(input_key)  # gone from the store under the job (an operator's mistake)
    failed = run_batch(second.id)
    assert failed.state == BatchJob.State.FAILED and failed.error.startswith("input unreadable: ")
    assert provider.script.calls() == 5
