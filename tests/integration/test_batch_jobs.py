"""A batch job on a real control worker that is SIGKILLed mid-job: another worker resumes it and
every line is billed exactly once. Both line formats: Switchyard's (/api/) and OpenAI's Batch
API (/v1/batches, whose output is a file of answer documents)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import close_old_connections

from bench.mockprovider import Behaviour, MockProviderServer
from billing.models import UsageRecord
from inference.batch import jobs as batch
from inference.models import BatchJob, GatewayFile, InferenceRequest
from registry.auth.roles import Role
from registry.store.objectstore import default_store
from tests.factories import make_user
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.integration.processes import Processes, wait_until

pytestmark = pytest.mark.integration

LINES = 40


@pytest.fixture
def provider() -> Iterator[MockProviderServer]:
    # Slow enough answers that the kill lands while the job is half done.
    server = MockProviderServer(Behaviour(text="answer", delay_ms=120)).start()
    yield server
    server.stop()


def _job(pk: int) -> BatchJob:
    close_old_connections()
    return BatchJob.objects.get(pk=pk)


def _openai_input(workflow_slug: str, operator: Any) -> GatewayFile:
    """An uploaded Batch API input, as POST /v1/files leaves it (tests/inference/openai_batches/)."""
    text = "".join(
        json.dumps(
            {
                "custom_id": f"row-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": workflow_slug, "messages": [{"role": "user", "content": f"q{i}"}]},
            }
        )
        + "\n"
        for i in range(LINES)
    ).encode()
    default_store().put("inference/files/input.jsonl", text)
    return GatewayFile.objects.create(
        purpose=GatewayFile.Purpose.BATCH,
        filename="input.jsonl",
        bytes=len(text),
        key="inference/files/input.jsonl",
        created_by=operator,
    )


@pytest.mark.parametrize("line_format", ["switchyard", "openai"])
def test_a_batch_job_survives_a_sigkilled_worker_and_bills_every_line_once(
    processes: Processes, provider: MockProviderServer, settings: Any, tmp_path: Path, line_format: str
) -> None:
    store_url = f"file://{tmp_path / 'objects'}"
    settings.OBJECT_STORE_URL = store_url
    env = {
        "OBJECT_STORE_URL": store_url,
        "SWITCHYARD_BATCH_PART_LINES": "5",
        "SWITCHYARD_BATCH_STALE_SECONDS": "3",
        "SWITCHYARD_BATCH_RESUME_SECONDS": "1",
    }
    operator = make_user(Role.OPERATOR)
    workflow = routed_workflow(operator, [priced_deployment(provider)])
    text = "".join(
        json.dumps({"custom_id": f"row-{i}", "messages": [{"role": "user", "content": f"q{i}"}]}) + "\n"
        for i in range(LINES)
    )
    processes.start("control", "worker", "--control", "--loglevel", "info", env=env)
    if line_format == "openai":
        job = batch.batch_job_create(
            workflow=workflow, user=operator, input_file=_openai_input(workflow.slug, operator), api="chat"
        )
    else:
        job = batch.batch_job_create(workflow=workflow, user=operator, input_jsonl=text)

    wait_until(
        lambda: _job(job.pk).done >= 12,
        timeout=120,
        what="the first worker to get going\n" + processes.log("control"),
    )
    processes.kill("control")  # mid-job: no shutdown handler runs, the task message is not acked
    killed_at = _job(job.pk)
    assert killed_at.state == BatchJob.State.RUNNING
    assert killed_at.done < LINES

    processes.start("control-again", "worker", "--control", "--loglevel", "info", env=env)
    processes.start("beat", "beat", "--loglevel", "warning", env=env)
    finished = wait_until(
        lambda: (j := _job(job.pk)).state != BatchJob.State.RUNNING and j,
        timeout=180,
        what="the job to finish after the kill\n" + processes.log("control-again") + processes.log("beat"),
    )
    assert finished.state == BatchJob.State.SUCCEEDED, finished.error
    assert (finished.done, finished.failed, finished.total) == (LINES, 0, LINES)

    # Every line is one recorded request, billed once: one input and one output ledger row each.
    requests = InferenceRequest.objects.filter(client_request_id__startswith=f"batch:{job.pk}:")
    assert requests.count() == LINES
    ledger_settled()
    assert UsageRecord.objects.count() == 2 * LINES
    assert finished.cost == sum(r.cost for r in requests)
    if line_format == "openai":
        assert finished.output_file is not None and finished.error_file is None
        out = [json.loads(x) for x in default_store().get(finished.output_file.key).splitlines()]
        assert [o["custom_id"] for o in out] == [f"row-{i}" for i in range(LINES)]
        assert len({o["response"]["request_id"] for o in out}) == LINES
        assert all(o["response"]["body"]["choices"][0]["message"]["content"] == "answer" for o in out)
        assert all(o["response"]["body"]["model"] == workflow.slug for o in out)
    else:
        out = [json.loads(x) for x in default_store().get(finished.output_uri).splitlines()]
        assert [o["custom_id"] for o in out] == [f"row-{i}" for i in range(LINES)]
        assert len({o["request_id"] for o in out}) == LINES
        assert all(o["response"]["text"] == "answer" for o in out)
    # Finished lines were not redone: the lines recorded before the kill were replayed, not
    # called; only a line the killed worker had in flight (called, not recorded) is called twice.
    assert LINES <= provider.behaviour.total_calls() <= LINES + 1
