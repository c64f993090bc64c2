"""A routed request as an OpenTelemetry trace: one span for the request, one child per call.

Built once the request is recorded (inference.router.finish), from what the router already
measured: each attempt's start (perf_counter) and latency become its span's start and end, so
the calls themselves carry no tracing code and a process with tracing off (the default; see
registry.tracing) pays one `if`. The request span is a child of whatever span is current
(a Celery task's, a batch line's), else the root of its own trace.

Attributes follow OpenTelemetry's GenAI semantic conventions: gen_ai.operation.name,
gen_ai.system, gen_ai.request.model (on the request span: the workflow the client named; on a
call: the provider's model id), gen_ai.response.model, gen_ai.usage.input_tokens and
output_tokens, gen_ai.response.finish_reasons; plus switchyard.cost (a decimal string, money is
never a float here), switchyard.currency, switchyard.policy_version, switchyard.workflow,
switchyard.deployment and switchyard.request_id. Attempts that made no call (circuit open,
below the quality floor, over budget or cost, unsupported) are events on the request span.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from decimal import Decimal

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from inference.adapters.base import Completion
from inference.models import Endpoint, InferenceAttempt
from inference.recording import AttemptInfo
from inference.selectors import PlanEntry

Outcome = InferenceAttempt.Outcome
_CALLED = frozenset({Outcome.OK.value, Outcome.RETRYABLE.value, Outcome.NON_RETRYABLE.value})
# gen_ai.operation.name per endpoint (batch lines and evals are chat calls).
_OPERATION = {Endpoint.COMPLETION.value: "text_completion", Endpoint.EMBEDDING.value: "embeddings"}
# gen_ai.system per adapter kind: the conventions' names where one fits; an OpenAI-compatible
# server speaks OpenAI's API whoever runs it.
_SYSTEM = {"bedrock": "aws.bedrock", "openai-compatible": "openai", "anthropic": "anthropic"}


def _system(entry: PlanEntry) -> str:
    kind = entry.target.kind
    return _SYSTEM.get(kind, f"switchyard.{kind}")


def route_trace(
    tracer: trace.Tracer,
    *,
    workflow: str,
    endpoint: str,
    started: float,
    attempts: Sequence[AttemptInfo],
    winner: PlanEntry | None,
    completion: Completion | None,
    request_id: int,
    cost: Decimal,
    currency: str,
    policy_version: int | None,
    error: str,
) -> None:
    """Emit the request's span and its calls' spans (times from perf_counter readings)."""
    now_perf, now_ns = time.perf_counter(), time.time_ns()

    def epoch_ns(perf: float) -> int:
        return now_ns - int((now_perf - perf) * 1e9)

    operation = _OPERATION.get(str(endpoint), "chat")
    attributes: dict[str, str | int | bool | Sequence[str]] = {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": workflow,
        "switchyard.workflow": workflow,
        "switchyard.endpoint": str(endpoint),
        "switchyard.request_id": request_id,
        "switchyard.cost": str(cost),
        "switchyard.currency": currency,
        "switchyard.attempts": len(attempts),
    }
    if policy_version is not None:
        attributes["switchyard.policy_version"] = policy_version
    if winner is not None:
        attributes["gen_ai.system"] = _system(winner)
        attributes["switchyard.deployment"] = winner.slug
    if winner is not None and completion is not None:
        attributes["gen_ai.response.model"] = completion.provider_model or winner.target.provider_model_id
        attributes["gen_ai.usage.input_tokens"] = completion.tokens_in
        attributes["gen_ai.usage.output_tokens"] = completion.tokens_out
        attributes["gen_ai.response.finish_reasons"] = [completion.finish_reason]
    request_span = tracer.start_span(
        f"{operation} {workflow}", kind=SpanKind.INTERNAL, attributes=attributes, start_time=epoch_ns(started)
    )
    parent = trace.set_span_in_context(request_span)
    for a in attempts:
        outcome = str(a.outcome)
        if outcome not in _CALLED:
            request_span.add_event(
                "switchyard.attempt.skipped",
                {
                    "switchyard.deployment": a.entry.slug,
                    "switchyard.outcome": outcome,
                    "switchyard.reason": a.error,
                },
                timestamp=epoch_ns(started),
            )
            continue
        model = a.entry.target.provider_model_id
        call: dict[str, str | int | bool | Sequence[str]] = {
            "gen_ai.operation.name": operation,
            "gen_ai.system": _system(a.entry),
            "gen_ai.request.model": model,
            "switchyard.deployment": a.entry.slug,
            "switchyard.attempt": a.position,
            "switchyard.outcome": outcome,
        }
        if a.status_code is not None:
            call["http.response.status_code"] = a.status_code
        answered = outcome == Outcome.OK.value
        if answered:
            call["gen_ai.usage.input_tokens"] = a.tokens_in
            call["gen_ai.usage.output_tokens"] = a.tokens_out
            call["switchyard.cost"] = str(a.cost)
            if winner is not None and a.entry is winner and completion is not None:
                call["gen_ai.response.model"] = completion.provider_model or model
                call["gen_ai.response.finish_reasons"] = [completion.finish_reason]
        else:
            call["error.type"] = str(a.status_code) if a.status_code is not None else outcome
        start = epoch_ns(a.started_at) if a.started_at else epoch_ns(started)
        span = tracer.start_span(
            f"{operation} {model}", context=parent, kind=SpanKind.CLIENT, attributes=call, start_time=start
        )
        if not answered:
            span.set_status(Status(StatusCode.ERROR, a.error[:200]))
        span.end(end_time=start + int(a.latency_ms * 1e6))
    if winner is None:
        request_span.set_status(Status(StatusCode.ERROR, error[:200]))
    request_span.end(end_time=now_ns)
