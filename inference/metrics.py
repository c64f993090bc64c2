"""The router's Prometheus series: counters and histograms bumped once per routed request.

This is the only metrics code on the request path, so it does no I/O and takes no lock beyond
prometheus-client's own: a few label lookups and increments after the request is recorded
(inference.router.finish). Under gunicorn the values live in prometheus-client's multiprocess
files (PROMETHEUS_MULTIPROC_DIR, set up by stack/gunicorn_conf.py) and /metrics sums every
worker's; elsewhere (runserver, tests, a Celery worker routing batch lines) they stay in the
process. Everything read at scrape time (spend, budgets, breakers, queues, training) is
stack.metrics' collector, not here.

SWITCHYARD_METRICS=false (settings.METRICS_ENABLED) skips these increments; `bench gateway`
runs the same load against a server with them on and one with them off to measure their cost.

Labels: workflow and deployment are slugs (the deployment that answered; empty when none did),
status is succeeded/failed, outcome an InferenceAttempt outcome (ok, retryable, circuit_open...).
"""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings
from prometheus_client import Counter, Histogram

from inference.models import InferenceAttempt, InferenceRequest
from inference.recording import AttemptInfo

Outcome = InferenceAttempt.Outcome
SUCCEEDED = str(InferenceRequest.Status.SUCCEEDED)
FAILED = str(InferenceRequest.Status.FAILED)
_CALLED = frozenset({Outcome.OK.value, Outcome.RETRYABLE.value, Outcome.NON_RETRYABLE.value})

# Seconds, from a cached local answer to a slow provider's long completion.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

REQUESTS = Counter(
    "switchyard_gateway_requests",
    "Routed requests, by workflow, the deployment that answered and status.",
    ("workflow", "deployment", "status"),
)
REQUEST_SECONDS = Histogram(
    "switchyard_gateway_request_duration_seconds",
    "Time from routing to the recorded answer, every attempt included.",
    ("workflow", "deployment", "status"),
    buckets=LATENCY_BUCKETS,
)
ATTEMPTS = Counter(
    "switchyard_gateway_attempts",
    "Attempts of routed requests (calls and skipped deployments), by outcome.",
    ("workflow", "deployment", "outcome"),
)
ATTEMPT_SECONDS = Histogram(
    "switchyard_gateway_attempt_duration_seconds",
    "Duration of the provider calls among the attempts.",
    ("workflow", "deployment", "outcome"),
    buckets=LATENCY_BUCKETS,
)
TOKENS = Counter(
    "switchyard_gateway_tokens",
    "Tokens of answered attempts, by type (input, output), as the provider reported them.",
    ("workflow", "deployment", "type"),
)


def route_observe(
    *, workflow: str, deployment: str, ok: bool, latency_ms: float, attempts: Sequence[AttemptInfo]
) -> None:
    """Count one routed request and its attempts (after it is recorded)."""
    if not settings.METRICS_ENABLED:
        return
    status = SUCCEEDED if ok else FAILED
    REQUESTS.labels(workflow, deployment, status).inc()
    REQUEST_SECONDS.labels(workflow, deployment, status).observe(latency_ms / 1000.0)
    for a in attempts:
        slug = a.entry.slug
        outcome = str(a.outcome)
        ATTEMPTS.labels(workflow, slug, outcome).inc()
        if outcome in _CALLED:
            ATTEMPT_SECONDS.labels(workflow, slug, outcome).observe(a.latency_ms / 1000.0)
        if outcome == Outcome.OK.value:
            if a.tokens_in:
                TOKENS.labels(workflow, slug, "input").inc(a.tokens_in)
            if a.tokens_out:
                TOKENS.labels(workflow, slug, "output").inc(a.tokens_out)
