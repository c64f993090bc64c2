"""Batch inference jobs: JSONL in the object store in, JSONL out, resumable after a worker dies.

Input: one JSON object per line, `{"custom_id": ..., "messages": [...]}` (chat) or
`{"custom_id": ..., "prompt": "..."}` (completion), optionally `max_tokens`, `temperature`,
`top_p`, `stop`. Lines are validated when the job is created (a bad line refuses the job).

Running (`batch_job_execute`, called by the `inference.batch_job_run` task):

* Lease: the job row's `updated_at` is the lease token. The runner claims a pending job, or a
  running one whose `updated_at` is older than INFERENCE_BATCH_STALE_SECONDS (its worker died),
  with a conditional UPDATE; after every line it renews the lease with a compare-and-set on
  the token it holds, so a runner that lost the lease (or a cancelled job) stops at once.
* Billing once: each line is routed with client_request_id `batch:<job>:<custom_id or line>`
  (a namespace no /v1 caller can write); a line retried after a crash is replayed from its
  recorded request, not called nor billed again.
* Input and output in parts: the input is read as a stream, INFERENCE_BATCH_PART_LINES lines at
  a time, each part's records written as one object (`.../part-00000.jsonl`); a resumed run
  skips the parts that exist. At the end the parts are joined into `output_uri`.
* A job of OpenAI's Batch API (`job.api`, /v1/batches) keeps each line's answer document in
  its parts and ends with OpenAI's output and error files (GatewayFile rows, written under a
  renewed lease; inference.batch.openai_files), also when cancelled or failed part way (the
  lines done); its parts are then deleted: those files are the answers' only copy.
* `inference.batch_jobs_resume` (beat) re-queues jobs whose lease went stale and pending jobs
  whose task message was lost, and writes the files of a Batch API job that ended while its
  runner was dead.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.db.models.functions import Coalesce
from django.utils import timezone

from billing.budgets import BudgetExhausted
from inference.admission import CallTooLarge, Paced, PacingStopped, call_pace, request_tokens
from inference.batch.lines import (
    BatchInputUnreadable,
    batch_lines_parse,
    batch_stored_lines,
    batch_stored_parts,
    job_prefix,
    output_key,
    part_key,
)
from inference.batch.openai_files import api_outputs_keep_partial, api_outputs_write
from inference.batch.pacing import batch_limits
from inference.gateway.apis import answer_document
from inference.idempotency import batch_request_id
from inference.models import BatchJob, Endpoint, GatewayFile, InferenceRequest
from inference.router.entry import route
from inference.router.errors import CapabilityMissing, CostLimitExceeded, NoRoute
from registry.claims import lease_claim, lease_release, lease_renew
from registry.models import ApiToken, Deployment, Workflow
from registry.queues import CONTROL_QUEUE, task_send
from registry.services import RegistryError
from registry.store.keys import ObjectReach, team_object_prefix
from registry.store.objectstore import default_store
from registry.tracing import span_attributes, tracer
from storage.objectstore import ObjectNotFoundError

BATCH_JOB_RUN = "inference.batch_job_run"  # inference.tasks registers it under this name

if TYPE_CHECKING:
    from inference.batch.lines import BatchLine


# One answer for every input_uri the caller may not name, whether or not the key exists: another
# team's key, a key of the platform's, a path that climbs out (`..`) or a URI instead of a key.
INPUT_URI_REFUSED = (
    "must be a key of the object store that the workflow's team owns "
    "(under teams/<team slug>/); no such key is yours to read"
)
_ACTIVE = (BatchJob.State.PENDING, BatchJob.State.RUNNING)


def stale_after() -> timedelta:
    """How long a running job's lease lasts without renewal; longer than one line can take."""
    return timedelta(seconds=settings.INFERENCE_BATCH_STALE_SECONDS)


def batch_job_create(
    *,
    workflow: Workflow,
    user: User | AnonymousUser | None,
    input_uri: str = "",
    input_jsonl: str | None = None,
    api_key: ApiToken | None = None,
    deployment: Deployment | None = None,
    max_rpm: int | None = None,
    holds_prompts_until: datetime | None = None,
    enqueue: bool = True,
    teams: frozenset[int] | None = None,
    input_file: GatewayFile | None = None,
    api: str = "",
    metadata: dict[str, str] | None = None,
) -> BatchJob:
    """Validate the input (a key in the object store, or JSONL text stored here) and queue the job.
    `api_key`: the key asked with (its budgets apply); `deployment`: the only one its lines call
    (a replay); `max_rpm`: its own pace; `holds_prompts_until`: its objects hold kept prompts;
    `enqueue=False`: the caller runs it itself (a replay study). `teams`: where the caller may
    create jobs (None: platform-wide); a key it names must be the workflow's team's (checked
    before the store is read). `input_file`, `api`, `metadata`: a job of OpenAI's Batch API
    (the gateway checked the caller sees the file; its lines are in OpenAI's format for `api`)."""
    if deployment is not None and not deployment.enabled:
        raise RegistryError(f"deployment {deployment.slug} is disabled", field="deployment")
    if max_rpm is not None and max_rpm < 1:
        raise RegistryError("max_rpm must be at least 1", field="max_rpm")
    if not isinstance(user, User):
        raise RegistryError("a signed-in user is required", field="created_by")
    store = default_store()
    data: bytes | None = None
    if input_file is not None:
        input_uri = input_file.key
        # Checked as it streams from the store (a file may be 200 MB): never held whole here.
        total = sum(1 for _ in batch_stored_lines(input_uri, api=api))
    elif input_jsonl is not None:
        if input_uri:
            raise RegistryError("give input_uri or input_jsonl, not both", field="input_uri")
        data = input_jsonl.encode("utf-8")
        batch_lines_parse(data)
        input_uri = f"{team_object_prefix(workflow.team)}inference/batch/inputs/{uuid.uuid4().hex}.jsonl"
        store.put(input_uri, data)
    else:
        input_uri = input_uri.strip()
        if not input_uri:
            raise RegistryError(
                "input_uri (an object store key) or input_jsonl is required", field="input_uri"
            )
        if not ObjectReach(teams=teams, team_id=workflow.team_id).may_read(input_uri):
            raise RegistryError(INPUT_URI_REFUSED, field="input_uri")
        try:
            data = store.get(input_uri)
        except (ObjectNotFoundError, ValueError) as exc:
            raise RegistryError(f"no object {input_uri!r} in the store ({exc})", field="input_uri") from None
    if data is not None:
        total = len(batch_lines_parse(data, api=api))
    with transaction.atomic():
        if (
            input_file is not None
            and not GatewayFile.objects.select_for_update().filter(pk=input_file.pk).exists()
        ):
            # Deleted meanwhile (inference.gateway.files locks the row the same way to delete it).
            raise RegistryError("the input file was deleted", field="input_file_id")
        job = BatchJob.objects.create(
            workflow=workflow,
            endpoint=Endpoint.BATCH,
            input_uri=input_uri,
            total=total,
            created_by=user,
            api_key=api_key,
            deployment=deployment,
            max_rpm=max_rpm,
            holds_prompts_until=holds_prompts_until,
            api=api,
            input_file=input_file,
            metadata=metadata,
        )
        if enqueue:
            transaction.on_commit(lambda: batch_job_enqueue(job_id=job.pk))
    return job


def batch_job_objects_delete(*, job: BatchJob) -> None:
    """Delete a job's input, parts and output objects and the answers kept on its request rows
    (a replay's hold kept prompts: inference.retention). Rows, counters and costs stay."""
    store = default_store()
    for key in [job.input_uri, *store.list(job_prefix(job))]:
        if key:
            store.delete(key)
    InferenceRequest.objects.filter(
        client_request_id__startswith=batch_request_id(job_id=job.pk, line_key="")
    ).exclude(response_text="").update(response_text="", response_doc=None)
    BatchJob.objects.filter(pk=job.pk).update(holds_prompts_until=None)


def batch_job_enqueue(*, job_id: int) -> None:
    """Send a job to its task on the control queue (by name: registry.queues.task_send)."""
    task_send(BATCH_JOB_RUN, job_id, queue=CONTROL_QUEUE)


def batch_job_cancel(*, job: BatchJob) -> BatchJob:
    """Stop a pending or running job; its runner sees the lost lease after the current line."""
    now = timezone.now()
    cancelled = lease_release(
        BatchJob,
        pk=job.pk,
        states=_ACTIVE,
        to_state=BatchJob.State.CANCELLED,
        heartbeat="updated_at",
        now=now,
        finished_at=now,
    )
    if not cancelled:
        raise RegistryError(f"batch {job.pk} is {job.state}, not pending or running", field="state")
    job.refresh_from_db()
    return job


def _claim(job_id: int) -> datetime | None:
    """Take the job's lease: a pending job, or a running one whose runner stopped renewing."""
    now = timezone.now()
    return lease_claim(
        BatchJob,
        pk=job_id,
        pending=BatchJob.State.PENDING,
        running=BatchJob.State.RUNNING,
        heartbeat="updated_at",
        stale_after=stale_after(),
        now=now,
        started_at=Coalesce("started_at", now),
    )


def _renew(job_id: int, token: datetime, **counters: Any) -> datetime | None:
    """Compare-and-set the lease; None when another runner took it or the job was cancelled."""
    running = [BatchJob.State.RUNNING]
    return lease_renew(
        BatchJob, pk=job_id, states=running, heartbeat="updated_at", holder={"updated_at": token}, **counters
    )


@dataclass
class _Tally:
    done: int = 0
    failed: int = 0
    cost: Decimal = Decimal("0")

    def add(self, record: dict[str, Any]) -> None:
        if record.get("error") is None:
            self.done += 1
        else:
            self.failed += 1
        self.cost += Decimal(str(record.get("cost") or "0"))

    def counters(self, extra: _Tally | None = None) -> dict[str, Any]:
        o = extra or _Tally()
        return {"done": self.done + o.done, "failed": self.failed + o.failed, "cost": self.cost + o.cost}


@contextmanager
def _line_span(job_id: int, line: BatchLine) -> Iterator[None]:
    """A span per line while tracing is on: the routed request's span nests under it."""
    spans = tracer()
    if spans is None:
        yield
        return
    attributes = {"switchyard.batch_job_id": job_id, "switchyard.batch_line": line.number}
    with spans.start_as_current_span("batch line", attributes=attributes):
        yield


def _run_line(job: BatchJob, line: BatchLine, lease: _Lease | None = None) -> dict[str, Any]:
    record: dict[str, Any] = {"custom_id": line.custom_id, "line": line.number}
    client_request_id = batch_request_id(job_id=job.pk, line_key=line.key)
    paced: Paced | None = None
    try:
        if not InferenceRequest.objects.filter(client_request_id=client_request_id).exists():
            # A line answered before a crash is replayed from its row: it costs no capacity.
            paced = call_pace(
                limits=batch_limits(job),
                tokens=request_tokens(line.request),
                keep_going=lambda: lease is None or _keep_lease(job.pk, lease),
            )
        result = route(
            workflow=job.workflow,
            request=line.request,
            endpoint=Endpoint.BATCH,
            client_request_id=client_request_id,
            api_key_id=job.api_key_id,
            deployment=job.deployment,
        )
    except CallTooLarge as exc:
        return _refused(record, f"rate limit: {exc}", "rate_limit_exceeded")
    except PacingStopped as exc:
        # The lease was lost (another runner, a cancel) while the line waited: it is not sent.
        return _refused(record, f"{exc} (the job was cancelled or taken over)", "batch_cancelled")
    except BudgetExhausted as exc:
        # Not recorded, so not billed: the line is reported failed in the output.
        return _refused(record, f"budget exhausted: {exc}", "budget_exhausted")
    except CostLimitExceeded as exc:
        return _refused(record, str(exc), "max_cost_exceeded")
    except CapabilityMissing as exc:
        return _refused(record, str(exc), "unsupported_feature")
    if paced is not None:
        c = result.completion
        paced.settle((c.tokens_in + c.tokens_out) if c is not None else 0)
        if paced.waits:
            record["rate_limit_waits"] = paced.waits  # how often the line waited for a window
    record["request_id"] = result.request_id
    record["cost"] = str(result.cost)
    if job.api and result.ok and result.completion is not None:
        # OpenAI's Batch API: the answer document the live endpoint would have sent.
        assert line.body is not None  # noqa: S101 (every line of such a job has one)
        record["body"] = answer_document(job.api, result, job.workflow.slug, line.body)
        record["error"] = None
    elif result.ok and result.completion is not None:
        record["response"] = {
            "text": result.completion.text,
            "deployment": result.deployment_slug,
            "tokens_in": result.completion.tokens_in,
            "tokens_out": result.completion.tokens_out,
        }
        record["error"] = None
    else:
        record["response"] = None
        record["error"] = result.error or "failed"
        record["code"] = "provider_error"
    return record


def _refused(record: dict[str, Any], error: str, code: str) -> dict[str, Any]:
    """A line refused before any provider answered it: nothing recorded, nothing billed."""
    return {**record, "response": None, "error": error, "code": code, "cost": "0"}


def _dump(records: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records)


@dataclass
class _Lease:
    token: datetime


def _keep_lease(job_id: int, lease: _Lease) -> bool:
    """Renew the lease while a line waits for a rate-limit window (False: it was lost)."""
    renewed = _renew(job_id, lease.token)
    if renewed is None:
        return False
    lease.token = renewed
    return True


def batch_job_execute(*, job_id: int) -> BatchJob | None:
    """Run (or resume) a job under its lease; None when another runner holds it or it is finished."""
    span_attributes(batch_job_id=job_id)
    token = _claim(job_id)
    if token is None:
        return None
    job = BatchJob.objects.select_related(
        "workflow__team", "api_key__team", "deployment__provider", "deployment__model"
    ).get(pk=job_id)
    lease = _Lease(token)
    parts = batch_stored_parts(job.input_uri, api=job.api, size=settings.INFERENCE_BATCH_PART_LINES)
    try:
        return _execute(job, parts, lease)
    except BatchInputUnreadable as exc:
        return _kept(_fail(job_id, lease.token, f"input unreadable: {exc}"))
    except Exception as exc:
        # A poison job fails visibly instead of being re-queued by the resume task forever
        # (keeping what it answered); a killed worker raises nothing here and is resumed.
        return _kept(_fail(job_id, lease.token, f"{type(exc).__name__}: {exc}"))


def _execute(job: BatchJob, parts: Iterator[list[BatchLine]], lease: _Lease) -> BatchJob | None:
    job_id = job.pk
    store = default_store()
    existing = set(store.list(job_prefix(job)))
    finished = _Tally()
    keys: list[str] = []
    for index, part in enumerate(parts):
        key = part_key(job, index)
        keys.append(key)
        if key in existing:
            # Written before a crash: its lines are done; re-read its counters only.
            for raw in store.get(key).splitlines():
                finished.add(json.loads(raw))
            continue
        current = _Tally()
        records: list[dict[str, Any]] = []
        for line in part:
            try:
                with _line_span(job_id, line):
                    record = _run_line(job, line, lease)
            except NoRoute as exc:
                store.put(key, _dump(records))
                return _kept(_fail(job_id, lease.token, f"no route: {exc}", finished.counters(current)))
            except Exception:
                store.put(key, _dump(records))  # the job fails (batch_job_execute): keep what it answered
                raise
            records.append(record)
            current.add(record)
            renewed = _renew(job_id, lease.token, **finished.counters(current))
            if renewed is None:  # lease lost: the other runner or the cancel decides
                if BatchJob.objects.filter(pk=job_id, state=BatchJob.State.CANCELLED).exists():
                    store.put(key, _dump(records))  # cancelled: what was answered is kept
                    _kept(BatchJob.objects.get(pk=job_id), finished.counters(current))
                return None
            lease.token = renewed
        store.put(key, _dump(records))
        for record in records:
            finished.add(record)
    now = timezone.now()
    if job.api:
        return _api_finish(job, keys, lease, finished, now)
    # Streamed a part file at a time: the output is never joined into one byte string.
    store.put_stream(output_key(job), (store.get(k) for k in keys))
    succeeded = lease_release(
        BatchJob,
        pk=job_id,
        states=[BatchJob.State.RUNNING],
        to_state=BatchJob.State.SUCCEEDED,
        heartbeat="updated_at",
        holder={"updated_at": lease.token},
        now=now,
        output_uri=output_key(job),
        finished_at=now,
        **finished.counters(),
    )
    return BatchJob.objects.get(pk=job_id) if succeeded else None


def _api_finish(
    job: BatchJob, keys: list[str], lease: _Lease, finished: _Tally, now: datetime
) -> BatchJob | None:
    """An OpenAI Batch API job's end: its output and error files, then its parts deleted."""
    renewed = _renew(job.pk, lease.token)  # a fresh lease for the writing
    if renewed is None:
        return None
    lease.token = renewed
    with transaction.atomic():
        outputs = api_outputs_write(job, keys)
        succeeded = lease_release(
            BatchJob,
            pk=job.pk,
            states=[BatchJob.State.RUNNING],
            to_state=BatchJob.State.SUCCEEDED,
            heartbeat="updated_at",
            holder={"updated_at": lease.token},
            now=now,
            finished_at=now,
            output_file=outputs.output,
            error_file=outputs.errors,
            **finished.counters(),
        )
        if not succeeded:
            transaction.set_rollback(True)  # the other runner (or the cancel) decides
    if not succeeded:
        outputs.discard()
        return None
    store = default_store()
    for key in keys:  # the answers now live in the output file only
        store.delete(key)
    return BatchJob.objects.get(pk=job.pk)


def _fail(
    job_id: int, token: datetime, error: str, counters: dict[str, Any] | None = None
) -> BatchJob | None:
    now = timezone.now()
    failed = lease_release(
        BatchJob,
        pk=job_id,
        states=[BatchJob.State.RUNNING],
        to_state=BatchJob.State.FAILED,
        heartbeat="updated_at",
        holder={"updated_at": token},
        now=now,
        error=error[:2000],
        finished_at=now,
        **(counters or {}),
    )
    return BatchJob.objects.get(pk=job_id) if failed else None


def _kept(job: BatchJob | None, counters: dict[str, Any] | None = None) -> BatchJob | None:
    """A job that ended part way, with the output and error files of the lines it did (Batch API)."""
    if job is not None and api_outputs_keep_partial(job, counters):
        job.refresh_from_db()
    return job


def batch_jobs_resume() -> list[int]:
    """Re-queue jobs whose runner died (stale lease) and pending jobs whose message was lost;
    keep the answers of Batch API jobs cancelled or failed while their runner was dead."""
    cutoff = timezone.now() - stale_after()
    ids = list(BatchJob.objects.filter(state__in=_ACTIVE, updated_at__lt=cutoff).values_list("pk", flat=True))
    for job_id in ids:
        batch_job_enqueue(job_id=job_id)
    # Those that ended in the last day (older ones had their sweeps; the scan stays bounded).
    ended = BatchJob.objects.filter(state__in=[BatchJob.State.CANCELLED, BatchJob.State.FAILED], api__gt="")
    ended = ended.filter(updated_at__lt=cutoff, updated_at__gt=cutoff - timedelta(days=1)).exclude(
        done=0, failed=0
    )
    for job in ended.filter(output_file__isnull=True, error_file__isnull=True).select_related("workflow"):
        _kept(job)
    return ids
