"""A batch job's input lines, checked when the job is created, and where its objects live: each
job's folder of the object store (its parts and output), and which team owns a key in it.

Two line formats: Switchyard's (`{"custom_id", "messages" | "prompt", ...}`, jobs of /api/)
and OpenAI's Batch API (`{"custom_id", "method": "POST", "url", "body"}`, jobs of /v1/batches),
whose body is checked by the parser of the API it names (inference.gateway.apis)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from inference.adapters.base import InferenceInput, RoutedInput
from inference.gateway.apis import BATCH_URLS, api_parse
from inference.gateway.openai_body import InvalidRequest, json_document
from inference.gateway.openai_request import chat_request_parse, completion_request_parse
from inference.idempotency import caller_key_problem
from inference.models import BatchJob
from registry.services import RegistryError
from registry.store.objectstore import default_store
from registry.validation import id_parse
from storage.objectstore import ObjectNotFoundError

MAX_LINES = 100_000  # OpenAI's Batch API allows 50,000 requests per batch
AUTO_API = "auto"  # batch_lines_iter: the OpenAI format, for the API the first line names


@dataclass(frozen=True)
class BatchLine:
    number: int  # 1-based line number in the input file
    key: str  # custom_id, or "line-<number>"
    custom_id: str | None
    request: RoutedInput
    # OpenAI's format only: the body as sent (an answer of /v1/responses echoes it) and its model.
    body: dict[str, Any] | None = None
    model: str | None = None


def _line_request(obj: dict[str, Any], where: str) -> InferenceInput:
    """The line's request, checked as the gateway checks a body (inference.gateway.openai_request)."""
    if "messages" in obj:
        parse = chat_request_parse
    elif "prompt" in obj:
        parse = completion_request_parse
    else:
        raise RegistryError(f"{where}: needs 'messages' (list) or 'prompt' (string)", field="input")
    try:
        return parse(obj, require_model=False).request
    except InvalidRequest as exc:
        raise RegistryError(f"{where}: {exc}", field="input") from None


def _api_line(obj: dict[str, Any], api: str, where: str) -> tuple[RoutedInput, dict[str, Any], str]:
    """An OpenAI Batch API line's request, body and model: its url must be the batch's endpoint."""
    unknown = sorted(set(obj) - {"custom_id", "method", "url", "body"})
    if unknown:
        raise RegistryError(f"{where}: unknown field {unknown[0]!r}", field="input")
    if obj.get("method") != "POST":
        raise RegistryError(f"{where}: method must be POST", field="input")
    url = obj.get("url")
    if not isinstance(url, str) or BATCH_URLS.get(url) != api:
        wanted = next(u for u, a in BATCH_URLS.items() if a == api)
        raise RegistryError(f"{where}: url must be the batch's endpoint, {wanted}", field="input")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise RegistryError(f"{where}: body must be an object", field="input")
    try:
        parsed = api_parse(api, body)
    except InvalidRequest as exc:
        raise RegistryError(f"{where}: body: {exc}", field="input") from None
    if getattr(parsed, "stream", False):
        raise RegistryError(f"{where}: body: stream is not allowed in a batch", field="input")
    assert parsed.model is not None  # noqa: S101 (required by the parser)
    return parsed.request, body, parsed.model


def batch_lines_parse(data: bytes, *, api: str = "") -> list[BatchLine]:
    """The requests of a JSONL input (blank lines skipped); RegistryError names the bad line.
    `api`: the API of an OpenAI Batch API job (inference.gateway.apis.BATCH_URLS), whose lines
    are in that format and must each have a custom_id; "": Switchyard's format."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RegistryError("input is not UTF-8 text", field="input") from None
    return list(batch_lines_iter(text.split("\n"), api=api))


def batch_lines_iter(raw_lines: Iterable[str | bytes], *, api: str = "") -> Iterator[BatchLine]:
    """The requests of JSONL lines, one at a time (an upload is checked without holding it).
    Lines end at "\n" only (a trailing "\r" is dropped): JSON strings may hold U+2028 or U+0085,
    which str.splitlines would take for line ends. `api`: as batch_lines_parse; AUTO_API: the
    OpenAI format, for the API the first line's url names (every line must name the same)."""
    seen: set[str] = set()
    count = 0
    for number, item in enumerate(raw_lines, start=1):
        where = f"line {number}"
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError:
                raise RegistryError(f"{where}: not UTF-8 text", field="input") from None
        raw = item.removesuffix("\n").removesuffix("\r")
        if not raw.strip():
            continue
        try:
            # Strict JSON, an object, valid Unicode throughout (a lone surrogate in a custom_id
            # or a message is refused here, not by the database or a provider), bounded depth.
            obj = json_document(raw)
        except InvalidRequest as exc:
            message = str(exc).replace("The request body", "the line")
            raise RegistryError(f"{where}: {message}", field="input") from None
        if api == AUTO_API:
            url = obj.get("url")
            api = BATCH_URLS.get(url, "") if isinstance(url, str) else ""
            if not api:
                raise RegistryError(f"{where}: url must be one of {', '.join(BATCH_URLS)}", field="input")
        custom_id = obj.get("custom_id")
        if api and custom_id is None:
            raise RegistryError(f"{where}: custom_id is required", field="input")
        if custom_id is not None:
            # It becomes part of the request's client_request_id: checked as every caller's key.
            problem = caller_key_problem(custom_id) if isinstance(custom_id, str) else "must be a string"
            if problem is not None:
                raise RegistryError(f"{where}: custom_id {problem}", field="input")
        key = custom_id if custom_id is not None else f"line-{number}"
        if key in seen:
            raise RegistryError(f"{where}: duplicate custom_id {key!r}", field="input")
        seen.add(key)
        count += 1
        if count > MAX_LINES:
            raise RegistryError(f"input has more than {MAX_LINES} lines", field="input")
        if api:
            request, body, model = _api_line(obj, api, where)
            yield BatchLine(number, key, custom_id, request, body, model)
        else:
            yield BatchLine(number, key, custom_id, _line_request(obj, where))
    if not count:
        raise RegistryError("input has no lines", field="input")


def batch_stored_lines(key: str, *, api: str) -> Iterator[BatchLine]:
    """The lines of an object of the store, checked as batch_lines_iter checks them, read as a
    stream (lines end at "\n" only). RegistryError for a missing object or a bad line."""
    try:
        stream = default_store().open_read(key)
    except (ObjectNotFoundError, ValueError):
        raise RegistryError("the input file is gone from the object store", field="input") from None
    with stream:
        yield from batch_lines_iter(stream, api=api)


class BatchInputUnreadable(Exception):
    """A running job's input is gone from the store or a line of it no longer parses."""


def batch_stored_parts(key: str, *, api: str, size: int) -> Iterator[list[BatchLine]]:
    """A job's input, `size` lines at a time, read as a stream (batch_stored_lines): its runner
    holds one part, never the whole input (a file may be 200 MB)."""
    part: list[BatchLine] = []
    try:
        for line in batch_stored_lines(key, api=api):
            part.append(line)
            if len(part) == size:
                yield part
                part = []
    except (RegistryError, OSError, ObjectNotFoundError) as exc:
        raise BatchInputUnreadable(str(exc)) from exc
    if part:
        yield part


def job_prefix(job: BatchJob) -> str:
    # The creation time keeps a job's parts apart from an older job that had the same id
    # (a database restored or recreated over the same store).
    stamp = job.created_at.strftime("%Y%m%dT%H%M%S%f")
    return f"inference/batch/jobs/{job.pk}-{stamp}/"


def part_key(job: BatchJob, index: int) -> str:
    return f"{job_prefix(job)}part-{index:05d}.jsonl"


def output_key(job: BatchJob) -> str:
    return f"{job_prefix(job)}output.jsonl"


def batch_key_team(rest: str) -> int | None:
    """The team that owns the object-store keys `inference/<rest>`: a job's parts and output
    (`inference/batch/jobs/<id>-<stamp>/...`) are its workflow's team's; anything else under
    `inference/` (inputs stored before teams owned keys) is the platform's (None)."""
    kind, _, rest = rest.partition("/")
    folder = rest.partition("/")[0]
    job_id = id_parse(folder.partition("-")[0])
    if kind != "batch" or job_id is None:
        return None
    job = BatchJob.objects.select_related("workflow").filter(pk=job_id).first()
    if job is None or job_prefix(job) != f"inference/batch/jobs/{folder}/":
        return None  # the folder of an older job that had the same id
    return job.workflow.team_id
