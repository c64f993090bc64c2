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
"""

from __future__ import annotations

import hashlib

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
    """The judge's call scoring a replayed answer (stack.decisions): billed once per result."""
    return f"replay:{candidate_id}:{request_id}:judge"
