"""OpenAI's Batch API on /v1/batches, on Switchyard's batch jobs (inference.batch): create a batch
from an uploaded file (inference.gateway.files) for /v1/chat/completions, /v1/completions,
/v1/responses or /v1/embeddings, list, read and cancel it; its output and error files are read
through /v1/files.

A batch is a BatchJob with `api` set: its lines are parsed as the live endpoint parses a body
(inference.gateway.apis), must all name one model (the workflow, which the key must be allowed
to call), and run as every batch line runs: paced under the key's, team's and workflow's rate
limits, budgets asked, billed once at the deployment's batch prices where it has them
(Unit.BATCH_INPUT_TOKENS_1M, BATCH_OUTPUT_TOKENS_1M), resumed after a worker dies. Who sees a
batch is the query every /v1 object of a workflow goes through (caller_rows).

Status: a queued or running job is `in_progress` (its lines were checked when it was created,
so it is never `validating`), then `completed`, `failed` or `cancelled`. Switchyard does not
expire batches: `completion_window` must be "24h" and `expires_at` is null.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from inference.batch.jobs import batch_job_cancel, batch_job_create
from inference.batch.lines import batch_stored_lines
from inference.batch.openai_files import batch_id, file_id
from inference.gateway.apis import BATCH_URLS
from inference.gateway.caller import caller_authorize, caller_grant, caller_rows, caller_workflow
from inference.gateway.files import (
    json_response,
    list_document,
    list_page,
    not_found,
    object_pk,
    visible_files,
)
from inference.gateway.openai_body import InvalidRequest, json_document
from inference.gateway.responses import GatewayError, error_response, invalid_response, method_not_allowed
from inference.models import BatchJob, GatewayFile
from registry.auth.access import TokenGrant
from registry.models import ApiToken
from registry.services import RegistryError

COMPLETION_WINDOW = "24h"  # the only window OpenAI offers
METADATA_PAIRS, METADATA_KEY_MAX, METADATA_VALUE_MAX = 16, 64, 512  # OpenAI's bounds
_FIELDS = {"input_file_id", "endpoint", "completion_window", "metadata"}
_STATUS = {
    BatchJob.State.PENDING: "in_progress",
    BatchJob.State.RUNNING: "in_progress",
    BatchJob.State.SUCCEEDED: "completed",
    BatchJob.State.FAILED: "failed",
    BatchJob.State.CANCELLED: "cancelled",
}
_URL_OF = {api: url for url, api in BATCH_URLS.items()}


def visible_batches(caller: TokenGrant) -> QuerySet[BatchJob]:
    rows = BatchJob.objects.exclude(api="").select_related("workflow")
    return caller_rows(rows, caller, team="workflow__team", workflow="workflow")


def _stamp(value: Any) -> int | None:
    return int(value.timestamp()) if value is not None else None


def batch_document(job: BatchJob) -> dict[str, Any]:
    """A batch as OpenAI's API shows it (no money: a batch's cost is in the ledger)."""
    state = job.state
    return {
        "id": batch_id(job.pk),
        "object": "batch",
        "endpoint": _URL_OF[job.api],
        "model": job.workflow.slug,
        "errors": (
            {
                "object": "list",
                "data": [{"code": "batch_failed", "message": job.error, "param": None, "line": None}],
            }
            if state == BatchJob.State.FAILED
            else None
        ),
        "input_file_id": file_id(job.input_file_id) if job.input_file_id else None,
        "completion_window": COMPLETION_WINDOW,
        "status": _STATUS[BatchJob.State(state)],
        "output_file_id": file_id(job.output_file_id) if job.output_file_id else None,
        "error_file_id": file_id(job.error_file_id) if job.error_file_id else None,
        "created_at": _stamp(job.created_at),
        "in_progress_at": _stamp(job.started_at),
        "expires_at": None,
        "finalizing_at": None,
        "completed_at": _stamp(job.finished_at) if state == BatchJob.State.SUCCEEDED else None,
        "failed_at": _stamp(job.finished_at) if state == BatchJob.State.FAILED else None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": _stamp(job.finished_at) if state == BatchJob.State.CANCELLED else None,
        "request_counts": {"total": job.total, "completed": job.done, "failed": job.failed},
        "metadata": job.metadata,
    }


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > METADATA_PAIRS:
        raise InvalidRequest(
            f"metadata must be an object of at most {METADATA_PAIRS} pairs", param="metadata"
        )
    for key, item in value.items():
        if len(key) > METADATA_KEY_MAX or not isinstance(item, str) or len(item) > METADATA_VALUE_MAX:
            raise InvalidRequest(
                f"metadata keys are at most {METADATA_KEY_MAX} characters and values strings of at most "
                f"{METADATA_VALUE_MAX}",
                param=f"metadata.{key[:METADATA_KEY_MAX]}",
            )
    return value


def _create(request: HttpRequest, caller: TokenGrant) -> HttpResponse:
    doc = json_document(request.read(settings.V1_MAX_BODY_BYTES + 1))
    unknown = sorted(set(doc) - _FIELDS)
    if unknown:
        raise InvalidRequest(f"Unknown parameter: {unknown[0]}", param=unknown[0], code="unknown_parameter")
    endpoint = doc.get("endpoint")
    api = BATCH_URLS.get(endpoint) if isinstance(endpoint, str) else None
    if api is None:
        raise InvalidRequest(f"endpoint must be one of {', '.join(BATCH_URLS)}", param="endpoint")
    if doc.get("completion_window") != COMPLETION_WINDOW:
        raise InvalidRequest(f"completion_window must be {COMPLETION_WINDOW!r}", param="completion_window")
    metadata = _metadata(doc.get("metadata"))
    raw_file = doc.get("input_file_id")
    if not isinstance(raw_file, str):
        raise InvalidRequest("input_file_id is required (an id from POST /v1/files)", param="input_file_id")
    pk = object_pk(raw_file, "file-sy")
    found = visible_files(caller).filter(pk=pk, purpose=GatewayFile.Purpose.BATCH).first() if pk else None
    if found is None:
        raise not_found("file", raw_file)
    names: set[str] = set()
    try:  # streamed from the store, line by line: a file may be 200 MB
        for line in batch_stored_lines(found.key, api=api):
            names.add(line.model or "")
            if len(names) > 1:
                break
    except RegistryError as exc:
        raise InvalidRequest(
            f"The input file is not a batch for {endpoint}: {exc}", param="input_file_id"
        ) from None
    models = sorted(names)
    if len(models) > 1:
        raise InvalidRequest(
            f"Every request of a batch must name the same model; this file names {', '.join(models[:5])}",
            param="input_file_id",
        )
    workflow = caller_workflow(models[0], caller)
    caller_authorize(caller, workflow)
    try:
        job = batch_job_create(
            workflow=workflow,
            user=User.objects.get(pk=caller.user_id),
            input_file=found,
            api=api,
            metadata=metadata,
            api_key=ApiToken.objects.get(pk=caller.token_id),
        )
    except RegistryError as exc:
        raise InvalidRequest(str(exc), param="input_file_id") from None
    job.workflow = workflow
    return json_response(batch_document(job))


@csrf_exempt
@transaction.non_atomic_requests
def batches(request: HttpRequest) -> HttpResponse:
    """POST /v1/batches (create) and GET /v1/batches (the caller's batches, newest first)."""
    if request.method not in ("GET", "POST"):
        return method_not_allowed("GET, POST")
    try:
        caller = caller_grant(request)
        if request.method == "POST":
            return _create(request, caller)
        page, more = list_page(request, visible_batches(caller), default_limit=20, prefix="batch_sy")
    except InvalidRequest as exc:
        return invalid_response(exc)
    except GatewayError as exc:
        return error_response(exc.status, str(exc), exc.type, exc.code)
    return json_response(list_document([batch_document(job) for job in page], more))


def _visible_batch(request: HttpRequest, raw_id: str) -> BatchJob:
    pk = object_pk(raw_id, "batch_sy")
    found = visible_batches(caller_grant(request)).filter(pk=pk).first() if pk is not None else None
    if found is None:
        raise not_found("batch", raw_id)
    return found


@csrf_exempt
@transaction.non_atomic_requests
def batch_item(request: HttpRequest, batch_ref: str) -> HttpResponse:
    """GET /v1/batches/{id}."""
    if request.method != "GET":
        return method_not_allowed("GET")
    try:
        return json_response(batch_document(_visible_batch(request, batch_ref)))
    except GatewayError as exc:
        return error_response(exc.status, str(exc), exc.type, exc.code, param="batch_id")


@csrf_exempt
@transaction.non_atomic_requests
def batch_cancel(request: HttpRequest, batch_ref: str) -> HttpResponse:
    """POST /v1/batches/{id}/cancel: the job stops after its current line (409 once it ended)."""
    if request.method != "POST":
        return method_not_allowed("POST")
    try:
        job = _visible_batch(request, batch_ref)
        job = batch_job_cancel(job=job)
    except GatewayError as exc:
        return error_response(exc.status, str(exc), exc.type, exc.code, param="batch_id")
    except RegistryError as exc:
        return error_response(409, str(exc), "invalid_request_error", "batch_not_active", param="batch_id")
    return json_response(batch_document(job))
