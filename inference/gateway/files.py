"""OpenAI's Files API on /v1/files, for the Batch API (inference.gateway.batches): upload a batch's
JSONL input (purpose `batch`), list, read, download and delete files, the batches' output and
error files among them.

A file is its uploader's team's (a team key's team; the platform's for a platform key), and a
batch's output is also its workflow's: who sees which is one query, caller_rows
(inference.gateway.caller), for every view here. A file out of sight answers as one that does
not exist. An upload is checked line by line as it arrives (each line a request of the Batch
API: inference.batch.lines), spooled to disk by Django past FILE_UPLOAD_MAX_MEMORY_SIZE and
streamed to the object store, so neither the check nor the store holds it whole; its limit is
SWITCHYARD_V1_MAX_FILE_BYTES (GatewayErrorsMiddleware refuses a longer body before it is read).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.multipartparser import MultiPartParserError
from django.views.decorators.csrf import csrf_exempt

from inference.batch.lines import AUTO_API, batch_lines_iter
from inference.batch.openai_files import file_id
from inference.gateway.caller import caller_grant, caller_rows
from inference.gateway.responses import GatewayError, error_response, method_not_allowed
from inference.models import BatchJob, GatewayFile
from registry.auth.access import TokenGrant
from registry.auth.roles import ALL_ROLES
from registry.models import Team
from registry.services import RegistryError
from registry.store.keys import team_object_prefix
from registry.store.objectstore import default_store
from registry.validation import id_parse
from storage.objectstore import ObjectNotFoundError

FILENAME_MAX = 255
LIST_LIMIT_MAX = 10_000  # OpenAI's own bound on a page of files


def visible_files(caller: TokenGrant) -> QuerySet[GatewayFile]:
    return caller_rows(
        GatewayFile.objects.all(), caller, team="team", workflow="workflow", uploader="api_key"
    )


def file_document(f: GatewayFile) -> dict[str, Any]:
    """A file as OpenAI's API shows it."""
    return {
        "id": file_id(f.pk),
        "object": "file",
        "bytes": f.bytes,
        "created_at": int(f.created_at.timestamp()),
        "filename": f.filename,
        "purpose": f.purpose,
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


def json_response(doc: dict[str, Any], status: int = 200) -> HttpResponse:
    return HttpResponse(
        json.dumps(doc, separators=(",", ":")), status=status, content_type="application/json"
    )


def not_found(kind: str, raw_id: str) -> GatewayError:
    return GatewayError(
        404, f"No such {kind}: {raw_id[:80]!r}", type_="invalid_request_error", code=f"{kind}_not_found"
    )


def object_pk(raw_id: str, prefix: str) -> int | None:
    """The row id in a /v1 id (`file-sy12`, `batch_sy12`); None for anything else."""
    return id_parse(raw_id.removeprefix(prefix)) if raw_id.startswith(prefix) else None


def visible_file(caller: TokenGrant, raw_id: str) -> GatewayFile:
    pk = object_pk(raw_id, "file-sy")
    found = visible_files(caller).filter(pk=pk).first() if pk is not None else None
    if found is None:
        raise not_found("file", raw_id)
    return found


def _gateway_error(exc: GatewayError, param: str | None = None) -> HttpResponse:
    return error_response(exc.status, str(exc), exc.type, exc.code, param=param)


def list_page(
    request: HttpRequest, rows: QuerySet[Any], *, default_limit: int, prefix: str
) -> tuple[list[Any], bool]:
    """One page of `rows` (newest first, or oldest first with order=asc) after the `after` id:
    OpenAI's cursor pagination. Bad parameters: GatewayError 400 naming them."""
    limit, order, after = list_params(request, default_limit=default_limit)
    rows = rows.order_by("pk" if order == "asc" else "-pk")
    if after is not None:
        pk = object_pk(after, prefix)
        if pk is None:
            raise GatewayError(
                400,
                f"after must be an id of this list ({prefix}...)",
                type_="invalid_request_error",
                code="invalid_after",
            )
        rows = rows.filter(pk__gt=pk) if order == "asc" else rows.filter(pk__lt=pk)
    page = list(rows[: limit + 1])
    return page[:limit], len(page) > limit


def list_params(request: HttpRequest, *, default_limit: int) -> tuple[int, str, str | None]:
    """A /v1 list's `limit` (1 to LIST_LIMIT_MAX), `order` (asc or desc, default desc) and
    `after` (an id, checked by the list); bad ones are a GatewayError 400 naming them."""
    limit = id_parse(request.GET.get("limit", str(default_limit)))
    if limit is None or not 1 <= limit <= LIST_LIMIT_MAX:
        raise GatewayError(
            400,
            f"limit must be an integer from 1 to {LIST_LIMIT_MAX}",
            type_="invalid_request_error",
            code="invalid_limit",
        )
    order = request.GET.get("order", "desc")
    if order not in ("asc", "desc"):
        raise GatewayError(
            400, "order must be asc or desc", type_="invalid_request_error", code="invalid_order"
        )
    return limit, order, request.GET.get("after")


def list_document(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": items,
        "first_id": items[0]["id"] if items else None,
        "last_id": items[-1]["id"] if items else None,
        "has_more": has_more,
    }


def _upload(request: HttpRequest, caller: TokenGrant) -> HttpResponse:
    if not (request.content_type or "").startswith("multipart/form-data"):
        return error_response(
            400,
            "Upload a file as multipart/form-data (fields file and purpose)",
            "invalid_request_error",
            "invalid_body",
        )
    try:
        upload = request.FILES.get("file")
        purpose = request.POST.get("purpose")
    except MultiPartParserError as exc:
        return error_response(
            400, f"The multipart body is malformed: {exc}", "invalid_request_error", "invalid_body"
        )
    if purpose != GatewayFile.Purpose.BATCH:
        return error_response(
            400,
            "purpose must be batch (the only purpose Switchyard keeps files for)",
            "invalid_request_error",
            "invalid_purpose",
            param="purpose",
        )
    if not isinstance(upload, UploadedFile):
        return error_response(400, "file is required", "invalid_request_error", "missing_file", param="file")
    filename = (upload.name or "upload.jsonl")[:FILENAME_MAX]
    # The caller's team: a team key's, or the platform's for a platform key, in which the
    # caller must hold a role (the rule of registry.auth.principal).
    if not caller.principal.may(ALL_ROLES, caller.team_id):
        return error_response(
            403, "This API key holds no role to upload files with", "permission_error", "permission_denied"
        )
    try:
        # The file object itself, not Django's File iteration (which ends lines at a bare "\r"
        # too): lines end at "\n" only, as when the batch is created and run.
        upload.seek(0)
        for _ in batch_lines_iter(upload.file or [], api=AUTO_API):
            pass  # each line is checked as it is read
    except RegistryError as exc:
        return error_response(
            400,
            f"The file is not a batch input: {exc}",
            "invalid_request_error",
            "invalid_file",
            param="file",
        )
    team = Team.objects.filter(pk=caller.team_id).first() if caller.team_id is not None else None
    key = f"{team_object_prefix(team)}inference/files/{uuid.uuid4().hex}.jsonl"
    upload.seek(0)
    store = default_store()
    store.put_stream(key, upload.chunks())
    try:
        with transaction.atomic():
            f = GatewayFile.objects.create(
                team=team,
                purpose=GatewayFile.Purpose.BATCH,
                filename=filename,
                bytes=upload.size or 0,
                key=key,
                created_by_id=caller.user_id,
                api_key_id=caller.token_id,
            )
    except Exception:
        store.delete(key)  # no row points at it
        raise
    return json_response(file_document(f))


@csrf_exempt
@transaction.non_atomic_requests
def files(request: HttpRequest) -> HttpResponse:
    """POST /v1/files (an upload) and GET /v1/files (the caller's files, `purpose` to filter)."""
    if request.method not in ("GET", "POST"):
        return method_not_allowed("GET, POST")
    try:
        caller = caller_grant(request)
        if request.method == "POST":
            return _upload(request, caller)
        rows = visible_files(caller)
        purpose = request.GET.get("purpose")
        if purpose is not None:
            if purpose not in GatewayFile.Purpose.values:
                raise GatewayError(
                    400,
                    f"purpose must be one of {', '.join(GatewayFile.Purpose.values)}",
                    type_="invalid_request_error",
                    code="invalid_purpose",
                )
            rows = rows.filter(purpose=purpose)
        page, more = list_page(request, rows, default_limit=LIST_LIMIT_MAX, prefix="file-sy")
    except GatewayError as exc:
        return _gateway_error(exc)
    return json_response(list_document([file_document(f) for f in page], more))


@csrf_exempt
@transaction.non_atomic_requests
def file_item(request: HttpRequest, file_ref: str) -> HttpResponse:
    """GET /v1/files/{id} (the file object) and DELETE /v1/files/{id} (its object and row; a file
    a running batch reads is refused with 409 until the batch ends or is cancelled)."""
    if request.method not in ("GET", "DELETE"):
        return method_not_allowed("GET, DELETE")
    try:
        f = visible_file(caller_grant(request), file_ref)
    except GatewayError as exc:
        return _gateway_error(exc, "file_id")
    if request.method == "GET":
        return json_response(file_document(f))
    active = (BatchJob.State.PENDING, BatchJob.State.RUNNING)
    with transaction.atomic():
        # The row locked as batch_job_create locks it: a batch is made from it or it is deleted.
        GatewayFile.objects.select_for_update().filter(pk=f.pk).exists()
        reader = BatchJob.objects.filter(input_file=f, state__in=active).values_list("pk", flat=True).first()
        if reader is None:
            GatewayFile.objects.filter(pk=f.pk).delete()
    if reader is not None:
        return error_response(
            409,
            f"File {file_id(f.pk)} is the input of batch batch_sy{reader}, which is still running: cancel it first",
            "invalid_request_error",
            "file_in_use",
            param="file_id",
        )
    default_store().delete(f.key)
    return json_response({"id": file_id(f.pk), "object": "file", "deleted": True})


@csrf_exempt
@transaction.non_atomic_requests
def file_content(request: HttpRequest, file_ref: str) -> HttpResponse | StreamingHttpResponse:
    """GET /v1/files/{id}/content: the file's bytes, streamed from the object store."""
    if request.method != "GET":
        return method_not_allowed("GET")
    try:
        f = visible_file(caller_grant(request), file_ref)
    except GatewayError as exc:
        return _gateway_error(exc, "file_id")
    try:
        chunks = default_store().iter_chunks(f.key)
    except (ObjectNotFoundError, ValueError):
        return _gateway_error(not_found("file", file_ref), "file_id")  # its object is gone
    response = StreamingHttpResponse(chunks, content_type="application/jsonl")
    response["Content-Length"] = str(f.bytes)
    return response
