"""A batch job's input lines, checked when the job is created, and where its objects live: each
job's folder of the object store (its parts and output), and which team owns a key in it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inference.adapters.base import InferenceInput
from inference.gateway.openai_body import InvalidRequest, json_document
from inference.gateway.openai_request import chat_request_parse, completion_request_parse
from inference.idempotency import caller_key_problem
from inference.models import BatchJob
from registry.services import RegistryError
from registry.validation import id_parse

MAX_LINES = 100_000


@dataclass(frozen=True)
class BatchLine:
    number: int  # 1-based line number in the input file
    key: str  # custom_id, or "line-<number>"
    custom_id: str | None
    request: InferenceInput


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


def batch_lines_parse(data: bytes) -> list[BatchLine]:
    """The requests of a JSONL input (blank lines skipped); RegistryError names the bad line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RegistryError("input is not UTF-8 text", field="input") from None
    lines: list[BatchLine] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"line {number}"
        try:
            # Strict JSON, an object, valid Unicode throughout (a lone surrogate in a custom_id
            # or a message is refused here, not by the database or a provider), bounded depth.
            obj = json_document(raw)
        except InvalidRequest as exc:
            message = str(exc).replace("The request body", "the line")
            raise RegistryError(f"{where}: {message}", field="input") from None
        custom_id = obj.get("custom_id")
        if custom_id is not None:
            # It becomes part of the request's client_request_id: checked as every caller's key.
            problem = caller_key_problem(custom_id) if isinstance(custom_id, str) else "must be a string"
            if problem is not None:
                raise RegistryError(f"{where}: custom_id {problem}", field="input")
        key = custom_id if custom_id is not None else f"line-{number}"
        if key in seen:
            raise RegistryError(f"{where}: duplicate custom_id {key!r}", field="input")
        seen.add(key)
        lines.append(BatchLine(number, key, custom_id, _line_request(obj, where)))
        if len(lines) > MAX_LINES:
            raise RegistryError(f"input has more than {MAX_LINES} lines", field="input")
    if not lines:
        raise RegistryError("input has no lines", field="input")
    return lines


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
