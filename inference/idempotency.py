"""Idempotency keys: the one place that builds InferenceRequest.client_request_id.

A request routed with a client_request_id seen before is answered from the recorded request
(inference.router), so whoever can choose a client_request_id can choose which recorded answer
comes back. The column therefore holds namespaces that cannot meet:

- `v1:<user id>:<workflow id>:<sha256 of the key>`: an Idempotency-Key sent to /v1. Scoped to the
  token's user (a user's tokens share their replays; another user's never match) and to the
  workflow (a token limited to workflow B can never name a key of workflow A). The caller's key
  is hashed, so whatever it says (`batch:1:line-0`, an eval's key) it lands in this namespace.
- `batch:<job>:<line key>`, `eval:<run>:<case>[:judge]` and `replay:<candidate>:<request>:judge`:
  written only by the batch runner, the eval runner and the replay scorer from ids they own; no caller input reaches these prefixes except a batch
  line's custom_id, inside its own job's namespace.

Keys that callers give (the Idempotency-Key header, a batch line's custom_id) are checked by
`caller_key_problem` where they enter, so a bad one is a 400 before any provider is called.

What a /v1 request with an Idempotency-Key leaves behind (the gateway keeps no answer unless
the workflow opted in to retention):

- always: the request row (its id, status, tokens, cost) and `request_digest`, the sha256 of
  the body. A retry with the same key and another body is refused (422
  `idempotency_key_reused`), never answered with this request's answer;
- the answer's text only when the workflow keeps prompts (Workflow.retain_prompts), and only for
  SWITCHYARD_IDEMPOTENCY_REPLAY_SECONDS (600) after the request (`answer_kept_until`). A retry
  in that window gets the answer again, unbilled. Beat's `idempotent_answers_purge` blanks the
  text once the window passed, and an opt-out blanks it at once (inference.retention);
- a retry whose answer is not kept (no opt-in, or the window passed) calls nothing and is
  answered 409 `idempotent_answer_not_kept`, naming the earlier request; a retry of a request
  that failed gets the same failure again. Either way nothing is called or billed twice.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from inference.models import InferenceRequest

CLIENT_REQUEST_ID_MAX_LENGTH = 128  # InferenceRequest.client_request_id
CALLER_KEY_MAX_LENGTH = 100
V1_PREFIX = "v1:"
INTERNAL_PREFIXES = ("batch:", "eval:", "replay:")


def caller_key_problem(key: str) -> str | None:
    """What is wrong with a key a caller sent (None: nothing): 1 to 100 printable characters."""
    if not key:
        return "must not be empty"
    if len(key) > CALLER_KEY_MAX_LENGTH:
        return f"must be at most {CALLER_KEY_MAX_LENGTH} characters"
    if not key.isprintable():
        return "must be printable characters (no control characters)"
    return None


def v1_request_id(*, user_id: int, workflow_id: int, key: str) -> str:
    """The client_request_id of an Idempotency-Key sent to /v1 by `user_id` for `workflow_id`."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{V1_PREFIX}{user_id}:{workflow_id}:{digest}"


def batch_request_id(*, job_id: int, line_key: str) -> str:
    """A batch line's client_request_id (line_key: its custom_id, or `line-<n>`)."""
    value = f"batch:{job_id}:{line_key}"
    if len(value) <= CLIENT_REQUEST_ID_MAX_LENGTH:
        return value
    # Only jobs created before custom_ids were limited to CALLER_KEY_MAX_LENGTH get here.
    return f"batch:{job_id}:sha256:{hashlib.sha256(line_key.encode()).hexdigest()}"


def eval_request_id(*, run_id: int, case_id: int, judge: bool = False) -> str:
    """An eval case's client_request_id (and its judge's, when the scorer asks a model)."""
    return f"eval:{run_id}:{case_id}" + (":judge" if judge else "")


def replay_judge_request_id(*, candidate_id: int, request_id: int) -> str:
    """The judge's call scoring a replayed answer (decisions): billed once per result."""
    return f"replay:{candidate_id}:{request_id}:judge"


class IdempotencyConflict(Exception):
    """A /v1 retry naming an Idempotency-Key already used that cannot be answered: another body
    (422) or an answer that was not kept (409). Nothing was called."""

    def __init__(self, message: str, *, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def request_digest(document: Any) -> str:
    """sha256 of a parsed /v1 body in one canonical form (key order and spacing do not count)."""
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def answer_kept(*, client_request_id: str | None, retain: bool) -> bool:
    """Whether a request's answer text is stored: always for the internal namespaces (batch and
    eval retries read it back); for a /v1 key only when the workflow keeps prompts."""
    if not client_request_id:
        return False
    if not client_request_id.startswith(V1_PREFIX):
        return True
    return retain and settings.IDEMPOTENCY_REPLAY_SECONDS > 0


def answer_kept_until(*, client_request_id: str | None, retain: bool, now: datetime) -> datetime | None:
    """When a kept /v1 answer stops being handed out (None: not a kept /v1 answer)."""
    if not client_request_id or not client_request_id.startswith(V1_PREFIX):
        return None
    if not answer_kept(client_request_id=client_request_id, retain=retain):
        return None
    return now + timedelta(seconds=settings.IDEMPOTENCY_REPLAY_SECONDS)


def replay_check(row: InferenceRequest, *, digest: str | None, now: datetime | None = None) -> None:
    """Raise IdempotencyConflict unless `row` (found by a /v1 retry's key) may be replayed."""
    if not (row.client_request_id or "").startswith(V1_PREFIX):
        return
    if digest and row.request_digest and digest != row.request_digest:
        raise IdempotencyConflict(
            f"This Idempotency-Key was used for another request body (request {row.pk}); "
            "send a new key for a new request",
            status=422,
            code="idempotency_key_reused",
        )
    if row.status != InferenceRequest.Status.SUCCEEDED:
        return  # the failure is replayed: its status, never a body
    now = now or timezone.now()
    if row.answer_kept_until is None or row.answer_kept_until <= now:
        raise IdempotencyConflict(
            f"This Idempotency-Key was already answered (request {row.pk}); the answer is not kept "
            "(the workflow does not retain answers, or the replay window passed). "
            "Nothing was called or billed again; send a new key to ask again",
            status=409,
            code="idempotent_answer_not_kept",
        )


def idempotent_answers_purge(*, now: datetime | None = None) -> int:
    """Blank the kept /v1 answers whose replay window passed; returns how many (beat's task)."""
    now = now or timezone.now()
    return InferenceRequest.objects.filter(answer_kept_until__lte=now).update(
        response_text="", response_doc=None, answer_kept_until=None
    )
