"""Admission: what every provider call Switchyard makes is counted as before it is made.

Every provider call goes through the router (inference.router: `/v1`, batch lines, eval runs and
their judges, replays and their judges, build-or-buy scoring, which runs eval runs), and every
one passes the same two gates:

* Rate limits: the call counts against the RPM/TPM windows of its key, its team and its
  workflow (and a batch job's own `max_rpm`): the same Redis windows whoever calls
  (inference.ratelimit.limits.rate_decide counts every one). `/v1` answers a full window with 429
  (inference.ratelimit.limits.RateCheck); a job waits until the window lets it through (`call_pace`),
  so it is paced, never fast.
  Tokens are counted before the call with `request_tokens` (the whole request plus
  `max_tokens`) and corrected with what the provider reported.
* Budgets: under a hard budget the router reserves the call's worst case (`worst_case_cost`:
  a batch line's at the batch prices it is billed at) in the budget's period row before the call, under a row lock, and settles to the real cost
  once it is in the ledger (billing.budgets.budget_admit / budget_settle). A call is admitted
  only while spent + reserved is below the limit, and each call in flight holds its worst case,
  so a hard budget is overspent by at most one call's worst case, whatever the concurrency.

The token count is an estimate of what the provider will bill, made from the request as sent:
UTF-8 bytes / 4 for text (OpenAI's rule of thumb for English; it counts scripts of several
bytes a character higher than characters / 4 did), the tools' and other structured fields' JSON
the same way, INFERENCE_IMAGE_TOKENS per image, and the chat template's per-message overhead.
The output worst case is `max_tokens` (times `n`), else the deployment's context window less the
input, else INFERENCE_MAX_OUTPUT_TOKENS.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings

from inference.adapters.base import ChatRequest, EmbeddingRequest, RoutedInput
from inference.ratelimit.limits import RateStoreDown, rate_decide, rate_settle, scope_limits
from inference.ratelimit.window import Decision, Limit

if TYPE_CHECKING:
    from inference.selectors import PlanEntry
    from registry.models import ApiToken, Team, Workflow

BYTES_PER_TOKEN = 4
# The chat template: each message is wrapped in role and separator tokens, and the reply is
# primed (OpenAI cookbook, "How to count tokens with tiktoken": 3 a message, 3 for the reply;
# one more a message here for a name or a tool call id).
MESSAGE_TOKENS = 4
REPLY_TOKENS = 3
# One wait is at most this long before the caller's `keep_going` is asked and the window again.
MAX_WAIT_S = 5.0
MILLION = Decimal(1_000_000)


def text_tokens(text: str) -> int:
    return -(-len(text.encode()) // BYTES_PER_TOKEN)


def _json_tokens(value: Any) -> int:
    if not value:
        return 0
    return text_tokens(json.dumps(value, separators=(",", ":"), default=str))


def _part_tokens(part: dict[str, Any]) -> int:
    if part.get("type") == "image_url":
        return int(settings.INFERENCE_IMAGE_TOKENS)
    return _json_tokens(part)  # audio, files: their (base64) payload as written


def input_tokens(request: RoutedInput) -> int:
    """The tokens the request's input occupies: messages with their content parts, tool calls
    and template overhead, tools and structured-output schemas (see the module docstring)."""
    if isinstance(request, EmbeddingRequest):
        if request.texts:
            return sum(text_tokens(text) for text in request.texts)
        return _json_tokens((request.wire or {}).get("input"))  # token-id inputs
    if not isinstance(request, ChatRequest):
        return text_tokens(request.prompt) + 1
    tokens = REPLY_TOKENS
    for message in request.messages:
        tokens += MESSAGE_TOKENS + text_tokens(message.content)
        tokens += sum(_part_tokens(part) for part in message.parts)
        tokens += _json_tokens(list(message.tool_calls))
    tokens += _json_tokens(list(request.tools))
    tokens += _json_tokens((request.wire or {}).get("functions"))  # the legacy form of tools
    if isinstance(request.tool_choice, dict):
        tokens += _json_tokens(request.tool_choice)
    tokens += _json_tokens(request.response_format)
    return tokens


def request_tokens(request: RoutedInput) -> int:
    """What a call counts against token-per-minute limits before it is made, and what a
    deployment's context window must hold: the input plus `max_tokens` (corrected afterwards
    with what the provider reported)."""
    return input_tokens(request) + (request.max_tokens or 0)


def worst_case_output_tokens(request: RoutedInput, *, max_context_tokens: int | None) -> int:
    if isinstance(request, EmbeddingRequest):
        return 0
    if request.max_tokens is not None:
        each = request.max_tokens
    elif max_context_tokens is not None:
        each = max(0, max_context_tokens - input_tokens(request))
    else:
        each = int(settings.INFERENCE_MAX_OUTPUT_TOKENS)
    return each * request.n


def worst_case_cost(entry: PlanEntry, request: RoutedInput, *, batch: bool = False) -> Decimal:
    """The most the call may cost on `entry`'s deployment: what a hard budget reserves, and
    what a workflow's max_cost_per_request is compared with. Each token at the dearest price the
    ledger may bill it at (inference.recording.attempts.billable_units): an input token at the
    input price (a batch line's: the batch input price, where there is one), the cached-input
    or the cache-write price, an output token at the output (batch output) price or the
    reasoning price."""
    tokens_in = Decimal(input_tokens(request))
    tokens_out = Decimal(worst_case_output_tokens(request, max_context_tokens=entry.max_context_tokens))
    in_price, out_price = entry.input_price, entry.output_price
    if batch and entry.batch_input_price is not None:
        in_price = entry.batch_input_price
    if batch and entry.batch_output_price is not None:
        out_price = entry.batch_output_price
    dear_in = _dearest(in_price, entry.cached_input_price, entry.cache_write_price)
    return (tokens_in * dear_in + tokens_out * _dearest(out_price, entry.reasoning_price)) / MILLION


def _dearest(*prices: Decimal | None) -> Decimal:
    return max((p for p in prices if p is not None), default=Decimal(0))


# --- Rate limits for jobs -----------------------------------------------------------------------


class CallTooLarge(Exception):  # noqa: N818 (a refusal reported on the call)
    """The call's token count exceeds a token limit: no window will ever admit it."""


def call_limits(
    *,
    workflow: Workflow,
    api_key: ApiToken | None,
    team: Team | None,
    extra: Iterable[tuple[str, int | None, int | None, int | None]] = (),
) -> list[Limit]:
    """The /v1 limits a call counts against: its key's, its team's and its workflow's (and any
    `extra` scope: a batch job's own max_rpm)."""
    return scope_limits(
        (
            (
                "key",
                api_key.pk if api_key else None,
                api_key.rpm_limit if api_key else None,
                api_key.tpm_limit if api_key else None,
            ),
            (
                "team",
                team.pk if team else None,
                team.rpm_limit if team else None,
                team.tpm_limit if team else None,
            ),
            ("workflow", workflow.pk, workflow.rpm_limit, workflow.tpm_limit),
            *extra,
        )
    )


def job_team(*, workflow: Workflow, api_key: ApiToken | None) -> Team | None:
    """The team a job's calls count against: its key's team, else (a job asked for from a page,
    or with a key of no team) the workflow's."""
    if api_key is not None and api_key.team_id is not None:
        return api_key.team
    return workflow.team


class PacingStopped(Exception):  # noqa: N818 (a signal to give up the call, not an error)
    """The caller stopped waiting for a window (a lost lease, a cancelled job): the call must
    not be made, since it was not counted."""


@dataclass
class Paced:
    """A call counted against its windows; `settle` corrects the token counts afterwards."""

    decision: Decision | None
    limits: list[Limit]
    waits: int = 0

    def settle(self, tokens_used: int | None) -> None:
        """Correct the token counts with what the provider reported (None: the count stands)."""
        rate_settle(self.limits, self.decision, tokens_used)


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def call_pace(
    *,
    limits: list[Limit],
    tokens: int,
    keep_going: Callable[[], bool] = lambda: True,
    sleep: Callable[[float], None] | None = None,
) -> Paced:
    """Count one job call against `limits`, waiting while a window is full (where /v1 would
    answer 429). `keep_going` is asked after each wait: False (a lost lease, a cancelled job)
    raises PacingStopped. CallTooLarge when no window can ever admit it.
    Redis unreachable: the call goes through (fail open, as /v1 does for keys that allow it)."""
    if not limits:
        return Paced(None, limits)
    waits = 0
    while True:
        try:
            decision = rate_decide(limits, tokens)
        except RateStoreDown:
            return Paced(None, limits, waits)
        if decision.allowed:
            return Paced(decision, limits, waits)
        if decision.retry_after_s is None:
            raise CallTooLarge("the call's tokens exceed a token-per-minute limit")
        (sleep or _sleep)(min(max(decision.retry_after_s, 0.01), MAX_WAIT_S))
        waits += 1
        if not keep_going():
            raise PacingStopped("stopped while waiting for a rate-limit window")
