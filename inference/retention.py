"""Opt-in prompt retention: the one writer and the one deleter of RetainedPrompt rows.

A workflow that opted in (Workflow.retain_prompts, with prompt_retention_days) has each answered
/v1 chat or completion request kept as a RetainedPrompt: the input as a batch line takes it
(`messages` or `prompt` plus the sampling parameters the caller set) and the answer's text,
until `created_at + prompt_retention_days`. Counterfactual routing (decisions) replays
them through candidate deployments.

Where the kept input travels: the gateway asks for it (`route(retain=True)`), the router builds
it after the answer (`retained_input`), the request's journal entry carries it (only for an
opted-in workflow) and the fold writes the row in the transaction that writes the request's
ledger rows (`retained_prompts_write`), off the answer's path. A workflow that did not opt in has
no kept input built, journaled or written anywhere.

A `/v1/responses` answer is kept the same way, as a StoredResponse (`stored_response_keep`),
for `previous_response_id` and GET /v1/responses/{id}: written on the answer's path (the next
turn names it at once), only under the opt-in and until the same expiry, deleted with the rest.

Opting out deletes at once: the fold re-reads the workflow's setting under a share lock
(`FOR SHARE`), which the opt-out's UPDATE waits for (and vice versa), so a request in flight
while the workflow opts out is either kept before the opt-out (and deleted by it) or not kept.
The opt-out (`retained_prompts_forget`, from the Workflow post_save signal) deletes the
workflow's rows and the replay objects that hold kept prompts (`batch_jobs_scrub`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from inference.adapters.base import ChatRequest, CompletionRequest, RoutedInput
from inference.models import BatchJob, InferenceRequest, RetainedPrompt, StoredResponse
from registry.models import Workflow

# The caller's settings that change the answer, kept with the prompt so a replay asks the same
# question (a batch line accepts each of them; `stream`, `n` and `user` are left out).
SAMPLING_FIELDS = (
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "response_format",
    "tools",
    "tool_choice",
)


def retained_input(request: RoutedInput) -> dict[str, Any] | None:
    """The request as a batch line takes it; None for a request that is not kept (embeddings)."""
    wire = request.wire
    if isinstance(request, ChatRequest):
        if wire is not None and "messages" in wire:
            out: dict[str, Any] = {"messages": wire["messages"]}
        else:
            out = {"messages": [{"role": m.role, "content": m.content} for m in request.messages]}
    elif isinstance(request, CompletionRequest):
        out = {"prompt": wire["prompt"] if wire is not None and "prompt" in wire else request.prompt}
    else:
        return None
    if wire is not None:
        out.update({k: wire[k] for k in SAMPLING_FIELDS if k in wire and wire[k] is not None})
    else:
        for name in ("max_tokens", "temperature", "top_p"):
            value = getattr(request, name, None)
            if value is not None:
                out[name] = value
    return out


def retained_prompts_write(entries: Sequence[tuple[int, int, datetime, Mapping[str, Any]]]) -> int:
    """Write the kept requests of folded requests: (request id, workflow id, created at, kept doc
    {"endpoint", "request", "response_text"}). Call inside the fold's transaction. Only workflows
    that keep prompts *now* get rows (read under FOR SHARE, see the module docstring)."""
    if not entries:
        return 0
    days = _retention_days({workflow_id for _, workflow_id, _, _ in entries})
    rows = [
        RetainedPrompt(
            inference_request_id=request_id,
            workflow_id=workflow_id,
            endpoint=str(kept.get("endpoint") or "chat"),
            request=kept["request"],
            response_text=str(kept.get("response_text") or ""),
            created_at=created_at,
            expires_at=created_at + timedelta(days=days[workflow_id]),
        )
        for request_id, workflow_id, created_at, kept in entries
        if workflow_id in days
    ]
    RetainedPrompt.objects.bulk_create(rows, ignore_conflicts=True)  # a refold writes nothing twice
    return len(rows)


def stored_response_keep(
    *, request_id: int, workflow_id: int, input_items: list[dict[str, Any]], response: dict[str, Any]
) -> bool:
    """Keep a /v1/responses answer for `previous_response_id` and GET /v1/responses/{id}
    (inference.gateway.stored), if its workflow keeps prompts now (read under FOR SHARE, as the
    fold reads it: an opt-out in flight either deletes this row or was made before it). Written
    on the answer's path, not by the fold: a client names the response in its next request at
    once. Returns whether it was kept."""
    with transaction.atomic():
        days = _retention_days({workflow_id}).get(workflow_id)
        if days is None:
            return False
        now = timezone.now()
        row = StoredResponse(
            inference_request_id=request_id,
            workflow_id=workflow_id,
            input_items=input_items,
            response=response,
            created_at=now,
            expires_at=now + timedelta(days=days),
        )
        StoredResponse.objects.bulk_create([row], ignore_conflicts=True)  # an idempotent replay
    return True


def _retention_days(workflow_ids: set[int]) -> dict[int, int]:
    """{workflow id: prompt_retention_days} of those workflows that keep prompts now."""
    if connection.vendor == "postgresql":
        return dict(_days_for_share(workflow_ids))
    # SQLite (the embedded demo) has one writer at a time: no lock is needed.
    found = Workflow.objects.filter(
        pk__in=workflow_ids, retain_prompts=True, prompt_retention_days__isnull=False
    ).values_list("pk", "prompt_retention_days")
    return {pk: d for pk, d in found if d is not None}


def _days_for_share(workflow_ids: set[int]) -> list[tuple[int, int]]:
    # FOR SHARE, not FOR UPDATE: folds of the same workflow run side by side; only an UPDATE of
    # the workflow row (the opt-out) waits for them, and they for it.
    table = connection.ops.quote_name(Workflow._meta.db_table)
    marks = ", ".join(["%s"] * len(workflow_ids))
    sql = (
        f"SELECT id, prompt_retention_days FROM {table} "  # noqa: S608 (names quoted, values bound)
        f"WHERE id IN ({marks}) AND retain_prompts AND prompt_retention_days IS NOT NULL FOR SHARE"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, sorted(workflow_ids))
        return [(int(pk), int(d)) for pk, d in cursor.fetchall()]


def retained_prompts_purge(*, now: datetime | None = None) -> dict[str, int]:
    """Delete kept requests past their expiry, and the replay objects (batch inputs and outputs)
    that hold kept prompts past theirs. Returns how many of each went (beat's task)."""
    now = now or timezone.now()
    deleted, _ = RetainedPrompt.objects.filter(expires_at__lte=now).delete()
    stored, _ = StoredResponse.objects.filter(expires_at__lte=now).delete()
    jobs = BatchJob.objects.filter(holds_prompts_until__lte=now)
    return {
        "retained_prompts": deleted,
        "stored_responses": stored,
        "batch_jobs_scrubbed": batch_jobs_scrub(jobs=jobs),
    }


def retained_prompts_forget(*, workflow_id: int) -> int:
    """A workflow opted out (or was never in): delete every kept request of it and every replay
    object that holds one. Returns how many kept requests went."""
    deleted, _ = RetainedPrompt.objects.filter(workflow_id=workflow_id).delete()
    StoredResponse.objects.filter(workflow_id=workflow_id).delete()
    # Answers kept for Idempotency-Key replays (inference.idempotency) go too.
    InferenceRequest.objects.filter(workflow_id=workflow_id, answer_kept_until__isnull=False).update(
        response_text="", response_doc=None, answer_kept_until=None
    )
    if connection.vendor == "postgresql":
        # A journal entry whose fold failed keeps its kept input until an operator refolds it:
        # drop the input from it now (jsonb `-` removes the key; the fold then keeps nothing).
        table = connection.ops.quote_name(InferenceRequest._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET ledger_pending = ledger_pending - 'kept' "  # noqa: S608 (quoted name)
                "WHERE workflow_id = %s AND ledger_pending ? 'kept'",
                [workflow_id],
            )
    batch_jobs_scrub(jobs=BatchJob.objects.filter(workflow_id=workflow_id, holds_prompts_until__isnull=False))
    return deleted


def batch_jobs_scrub(*, jobs: Any) -> int:
    """Delete the input, parts and output objects of batch jobs that hold kept prompts (replays)
    and the answers kept on their request rows; the rows, counters and costs stay."""
    from inference.batch.jobs import batch_job_objects_delete  # noqa: PLC0415 (batch imports the router)

    count = 0
    for job in list(jobs.filter(holds_prompts_until__isnull=False)):
        batch_job_objects_delete(job=job)
        count += 1
    return count
