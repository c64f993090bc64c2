"""The output of a job of OpenAI's Batch API: its parts' records turned into OpenAI's output file
(one line per answered request) and error file (one per failed line), each a GatewayFile of the
job's workflow and team, written a part at a time (never joined in memory). A job cancelled or
failed part way keeps the files of the lines it finished (`api_outputs_keep_partial`), as
OpenAI's batches do: answers that were paid for are never lost with the parts."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from inference.batch.lines import job_prefix
from inference.models import BatchJob, GatewayFile
from registry.store.objectstore import default_store


def file_id(pk: int) -> str:
    """A file's id on /v1/files (OpenAI's are `file-...`)."""
    return f"file-sy{pk}"


def batch_id(pk: int) -> str:
    """A batch's id on /v1/batches (OpenAI's are `batch_...`)."""
    return f"batch_sy{pk}"


def _output_line(job: BatchJob, record: dict[str, Any]) -> dict[str, Any] | None:
    if record.get("error") is not None:
        return None
    rid = record.get("request_id")
    return {
        "id": f"batch_req_sy{rid}",
        "custom_id": record.get("custom_id"),
        "response": {"status_code": 200, "request_id": f"req_sy{rid}", "body": record.get("body")},
        "error": None,
    }


def _error_line(job: BatchJob, record: dict[str, Any]) -> dict[str, Any] | None:
    if record.get("error") is None:
        return None
    rid = record.get("request_id")
    return {
        # A refused line has no request: its id names the job and the line.
        "id": f"batch_req_sy{rid}" if rid is not None else f"batch_req_sy{job.pk}_line{record.get('line')}",
        "custom_id": record.get("custom_id"),
        "response": None,
        "error": {"code": record.get("code") or "failed", "message": str(record["error"])},
    }


@dataclass
class ApiOutputs:
    output: GatewayFile | None
    errors: GatewayFile | None

    def discard(self) -> None:
        """Delete what was written (the job was cancelled or taken over meanwhile)."""
        store = default_store()
        for f in (self.output, self.errors):
            if f is not None:
                store.delete(f.key)


def _write(
    job: BatchJob,
    keys: list[str],
    name: str,
    shape: Callable[[BatchJob, dict[str, Any]], dict[str, Any] | None],
    attempt: str,
) -> GatewayFile | None:
    """One output object from the parts (None and nothing kept when no record has this shape).
    `attempt` keeps each runner's objects apart: a runner that lost the lease while writing
    discards its own objects, never the winner's."""
    store = default_store()
    key = f"{job_prefix(job)}{name}-{attempt}.jsonl"
    size = 0

    def chunks() -> Iterator[bytes]:
        nonlocal size
        for part in keys:
            lines = []
            for raw in store.get(part).splitlines():
                line = shape(job, json.loads(raw))
                if line is not None:
                    lines.append(json.dumps(line, separators=(",", ":")).encode() + b"\n")
            chunk = b"".join(lines)
            size += len(chunk)
            if chunk:
                yield chunk

    store.put_stream(key, chunks())
    if size == 0:
        store.delete(key)
        return None
    return GatewayFile.objects.create(
        team_id=job.workflow.team_id,
        workflow_id=job.workflow_id,
        purpose=GatewayFile.Purpose.BATCH_OUTPUT,
        filename=f"{batch_id(job.pk)}_{name}.jsonl",
        bytes=size,
        key=key,
        created_by_id=job.created_by_id,
        api_key_id=job.api_key_id,
    )


def api_outputs_write(job: BatchJob, keys: list[str]) -> ApiOutputs:
    """The job's output and error files, from its part objects `keys` (in line order)."""
    attempt = uuid.uuid4().hex[:12]
    output = _write(job, keys, "output", _output_line, attempt)
    try:
        errors = _write(job, keys, "errors", _error_line, attempt)
    except BaseException:
        ApiOutputs(output, None).discard()
        raise
    return ApiOutputs(output=output, errors=errors)


def api_outputs_keep_partial(job: BatchJob, counters: dict[str, Any] | None = None) -> bool:
    """A Batch API job that was cancelled, or failed part way, gets the output and error files of
    the parts it wrote (with `counters`, the lines they hold), then its parts are deleted. Once
    per job, under its row lock, and only once it has ended so: its runner has stopped, or stops
    at its next line (the cancel took its lease). Returns whether files were written."""
    if not job.api:
        return False
    store = default_store()
    prefix = job_prefix(job)
    keys = sorted(k for k in store.list(prefix) if k.startswith(f"{prefix}part-"))
    if not keys:
        return False
    with transaction.atomic():
        ended = (
            BatchJob.objects.select_for_update()
            .filter(pk=job.pk, state__in=[BatchJob.State.CANCELLED, BatchJob.State.FAILED])
            .filter(output_file__isnull=True, error_file__isnull=True)
            .exists()
        )
        if not ended:
            return False
        outputs = api_outputs_write(job, keys)
        BatchJob.objects.filter(pk=job.pk).update(
            output_file=outputs.output, error_file=outputs.errors, **(counters or {})
        )
    for key in keys:  # the answers now live in the files only
        store.delete(key)
    return True
