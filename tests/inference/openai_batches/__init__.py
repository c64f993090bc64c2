"""OpenAI's Files and Batch APIs on the gateway, driven by the official `openai` SDK.

The SDK uploads a JSONL file, creates a batch, polls it and downloads the output and error files;
the job runs as every batch job runs (the Celery task, applied here in the test process; a real
worker runs one in tests/integration/test_batch_jobs.py). The workflow's deployment is a
loopback provider that records each body it gets: the tests check those bodies, the answer
documents in the output file (the live endpoint's, line for line), the ledger at the batch
prices, and who may see which file and batch. The tests are in this package's modules; the
helpers they share are here.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import openai

from inference import tasks
from inference.models import BatchJob
from registry.models import Workflow
from tests.inference.recording_provider import RecordingProvider, chat_answer

__all__ = [
    "BATCH_IN",
    "BATCH_OUT",
    "USAGE",
    "chat_lines",
    "file_lines",
    "five_line_batch",
    "jsonl",
    "run_batch",
]

BATCH_IN, BATCH_OUT = Decimal("0.5"), Decimal("1.5")  # half of tests.inference.helpers' prices
USAGE = {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def chat_lines(workflow: Workflow, n: int) -> list[dict[str, Any]]:
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


def run_batch(batch_id: str) -> BatchJob:
    """Run the job the way its Celery task does (the message the API queued is left alone)."""
    job = BatchJob.objects.get(pk=int(batch_id.removeprefix("batch_sy")))
    tasks.batch_job_run.apply(args=(job.pk,))
    job.refresh_from_db()
    return job


def file_lines(client: openai.OpenAI, file_id: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def five_line_batch(team_setup: dict[str, Any], provider: RecordingProvider) -> tuple[openai.OpenAI, Any]:
    client, workflow = team_setup["client"], team_setup["workflow"]
    provider.script.answer = chat_answer("ok", usage=USAGE)
    uploaded = client.files.create(file=("in.jsonl", jsonl(chat_lines(workflow, 5))), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return client, batch
