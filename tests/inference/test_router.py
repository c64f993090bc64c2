"""The router: failover, retries, breakers, quality demotion, budgets, records (the strategies'
ordering is tested without a database in test_routing_core.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User

from bench.mockprovider import MockProviderServer
from billing.budgets import BudgetExhausted
from billing.models import Budget, UsageRecord
from inference.adapters.base import ChatMessage, ChatRequest
from inference.breaker.breakers import breaker_state
from inference.models import InferenceAttempt, InferenceRequest, RetainedPrompt
from inference.recording import db_text
from inference.router.entry import route
from inference.router.policy import Strategy
from inference.services import quality_record_create
from registry.models import FailoverEvent, RoutingPolicyVersion
from tests.factories import make_deployment
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db
PING = ChatRequest(messages=(ChatMessage("user", "ping"),))
Outcome = InferenceAttempt.Outcome


def test_the_core_strategies_are_the_policy_strategies() -> None:
    assert {s.value for s in Strategy} == set(RoutingPolicyVersion.Strategy.values)


# --- Routing over loopback providers -------------------------------------------------------------------


def test_success_records_request_attempt_and_usage(
    admin_user: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    server = mock_provider(tokens_in=1000, tokens_out=500)
    primary = priced_deployment(server)
    workflow = routed_workflow(admin_user, [primary, priced_deployment(server)])
    result = route(workflow=workflow, request=PING)
    assert result.ok and result.deployment_slug == primary.slug
    # 1000 in at $1/1M + 500 out at $3/1M
    assert result.cost == Decimal("0.002500000")
    row = InferenceRequest.objects.get(pk=result.request_id)
    assert (row.status, row.deployment_id, row.tokens_in, row.tokens_out, row.attempts) == (
        "succeeded",
        primary.pk,
        1000,
        500,
        1,
    )
    assert row.policy_version_id == workflow.policy_versions.get().pk
    usage = UsageRecord.objects.filter(subject_type="inference_request", subject_id=str(row.pk))
    assert sorted(usage.values_list("unit", "amount")) == [
        ("input_tokens_1m", Decimal("0.001000000")),
        ("output_tokens_1m", Decimal("0.001500000")),
    ]
    assert all(u.workflow_id == workflow.pk and u.deployment_id == primary.pk for u in usage)
    assert FailoverEvent.objects.count() == 0


def test_cheapest_policy_calls_the_deployment_with_the_lowest_price_books(
    admin_user: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    dear_server, cheap_server = mock_provider(), mock_provider()
    dear = priced_deployment(dear_server, in_price=Decimal("5"), out_price=Decimal("15"))
    cheap = priced_deployment(cheap_server, in_price=Decimal("0.5"), out_price=Decimal("1.5"))
    workflow = routed_workflow(admin_user, [dear, cheap], strategy=Strategy.CHEAPEST)
    result = route(workflow=workflow, request=PING)
    assert result.ok and result.deployment_slug == cheap.slug
    assert dear_server.behaviour.total_calls() == 0 and cheap_server.behaviour.total_calls() == 1


def test_retryable_error_fails_over_and_records_the_event(
    admin_user: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    failing, healthy = mock_provider(status=503), mock_provider()
    primary, fallback = priced_deployment(failing), priced_deployment(healthy)
    workflow = routed_workflow(admin_user, [primary, fallback])
    result = route(workflow=workflow, request=PING)
    assert result.ok and result.deployment_slug == fallback.slug
    attempts = list(
        InferenceAttempt.objects.filter(request_id=result.request_id).values_list(
            "deployment_id", "outcome", "status_code"
        )
    )
    assert attempts == [(primary.pk, Outcome.RETRYABLE, 503), (fallback.pk, Outcome.OK, 200)]
    event = FailoverEvent.objects.get()
    assert (event.kind, event.from_deployment_id, event.to_deployment_id, event.status_code) == (
        "inference",
        primary.pk,
        fallback.pk,
        503,
    )
    assert event.from_provider_id == primary.provider_id and event.time_lost is not None
    assert event.subject == f"inference-request:{result.request_id}" and event.code == "http_5xx"
    assert failing.behaviour.total_calls() == 1  # moved on at once, no retry of the primary


def test_client_error_is_not_retried_nor_failed_over(
    admin_user: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    rejecting, healthy = mock_provider(status=400), mock_provider()
    workflow = routed_workflow(admin_user, [priced_deployment(rejecting), priced_deployment(healthy)])
    result = route(workflow=workflow, request=PING)
    assert not result.ok and result.status_code == 400
    assert rejecting.behaviour.total_calls() == 1 and healthy.behaviour.total_calls() == 0
    row = InferenceRequest.objects.get(pk=result.request_id)
    assert row.status == "failed" and "HTTP 400" in row.error
    assert FailoverEvent.objects.count() == 0


def test_failing_everywhere_is_recorded_with_every_attempt_and_retried_with_backoff(
    admin_user: User, mock_provider: Callable[..., MockProviderServer], settings: Any
) -> None:
    settings.INFERENCE_MAX_ROUNDS = 2
    settings.INFERENCE_BACKOFF_SECONDS = 0.01
    settings.INFERENCE_BREAKER_MIN_REQUESTS = 100  # keep the breakers out of this test
    a, b = mock_provider(status=502), mock_provider(status=429)
    da, db = priced_deployment(a), priced_deployment(b)
    workflow = routed_workflow(admin_user, [da, db])
    result = route(workflow=workflow, request=PING)
    assert not result.ok
    row = InferenceRequest.objects.get(pk=result.request_id)
    assert row.status == "failed" and row.deployment_id is None and row.attempts == 4 and row.cost == 0
    outcomes = list(row.attempt_rows.order_by("position").values_list("deployment_id", "status_code"))
    assert outcomes == [(da.pk, 502), (db.pk, 429), (da.pk, 502), (db.pk, 429)]
    # Each failed call that led to another is an event; the last one led nowhere.
    assert FailoverEvent.objects.count() == 3
    codes = list(FailoverEvent.objects.order_by("id").values_list("code", flat=True))
    assert codes == ["http_5xx", "http_429", "http_5xx"]
    assert UsageRecord.objects.count() == 0
    assert a.behaviour.total_calls() == 2 and b.behaviour.total_calls() == 2


def test_deadline_bounds_the_request(
    admin_user: User, mock_provider: Callable[..., MockProviderServer], settings: Any
) -> None:
    settings.INFERENCE_BREAKER_MIN_REQUESTS = 100
    slow = mock_provider(delay_ms=400)
    healthy = mock_provider()
    workflow = routed_workflow(admin_user, [priced_deployment(slow), priced_deployment(healthy)])
    result = route(workflow=workflow, request=PING, deadline_s=0.1)
    # The slow primary timed out within the deadline and nothing was left for the fallback.
    assert not result.ok and "deadline passed" in result.error
    assert healthy.behaviour.total_calls() == 0


def test_circuit_opens_probes_and_closes(
    admin_user: User, mock_provider: Callable[..., MockProviderServer], settings: Any
) -> None:
    settings.INFERENCE_BREAKER_MIN_REQUESTS = 3
    settings.INFERENCE_BREAKER_FAILURE_RATE = 0.5
    settings.INFERENCE_BREAKER_COOLDOWN_SECONDS = 0.3
    flaky, healthy = mock_provider(status=503), mock_provider()
    primary, fallback = priced_deployment(flaky), priced_deployment(healthy)
    workflow = routed_workflow(admin_user, [primary, fallback])
    for _ in range(3):
        assert route(workflow=workflow, request=PING).ok
    assert breaker_state(primary.pk) == "open"
    assert flaky.behaviour.total_calls() == 3
    skipped = route(workflow=workflow, request=PING)
    assert skipped.ok and flaky.behaviour.total_calls() == 3  # not called while open
    assert [a.outcome for a in skipped.attempts] == [Outcome.CIRCUIT_OPEN, Outcome.OK]
    # After the cooldown one request probes; it fails, so the circuit opens again.
    time.sleep(0.35)
    assert route(workflow=workflow, request=PING).ok
    assert flaky.behaviour.total_calls() == 4 and breaker_state(primary.pk) == "open"
    # The provider recovers: the next probe closes the circuit and the primary serves again.
    flaky.behaviour.status = 200
    time.sleep(0.35)
    probe = route(workflow=workflow, request=PING)
    assert probe.deployment_slug == primary.slug and breaker_state(primary.pk) == "closed"
    assert route(workflow=workflow, request=PING).deployment_slug == primary.slug


def test_quality_demotion_skips_with_one_event(
    admin_user: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    server = mock_provider()
    weak, good = priced_deployment(server), priced_deployment(server)
    workflow = routed_workflow(admin_user, [weak, good], quality_floor=Decimal("0.6"))
    quality_record_create(deployment=weak, workflow=workflow, source="eval", score=Decimal("0.3"))
    quality_record_create(deployment=good, workflow=workflow, source="feedback", score=0.9)
    first = route(workflow=workflow, request=PING)
    second = route(workflow=workflow, request=PING)
    assert first.deployment_slug == good.slug and second.deployment_slug == good.slug
    assert first.attempts[0].outcome == Outcome.SKIPPED_QUALITY
    events = FailoverEvent.objects.filter(from_deployment=weak)
    assert events.count() == 1 and "quality demotion" in events.get().reason
    assert events.get().code == "quality_demotion"
    # Its quality recovers above the floor: it serves again.
    for _ in range(30):
        quality_record_create(deployment=weak, workflow=workflow, source="eval", score=1)
    assert route(workflow=workflow, request=PING).deployment_slug == weak.slug


def test_budget_exhausted_fails_closed(
    admin_user: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    server = mock_provider(tokens_in=1_000_000, tokens_out=0)
    workflow = routed_workflow(admin_user, [priced_deployment(server)])
    Budget.objects.create(
        name="wf cap",
        scope=Budget.Scope.WORKFLOW,
        workflow=workflow,
        limit_amount=Decimal("1.5"),
        hard_limit=True,
    )
    assert route(workflow=workflow, request=PING).cost == Decimal("1.000000000")
    assert route(workflow=workflow, request=PING).ok  # 1.0 < 1.5: still admitted
    calls = server.behaviour.total_calls()
    with pytest.raises(BudgetExhausted, match="wf cap"):
        route(workflow=workflow, request=PING)
    assert server.behaviour.total_calls() == calls  # nothing was called
    refused = InferenceRequest.objects.order_by("-id").first()
    assert refused is not None and refused.status == "failed"
    assert list(refused.attempt_rows.values_list("outcome", flat=True)) == [Outcome.BUDGET]


def test_client_request_id_is_never_billed_twice(
    admin_user: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    server = mock_provider(text="answer")
    workflow = routed_workflow(admin_user, [priced_deployment(server)])
    first = route(workflow=workflow, request=PING, client_request_id="batch-7:line-3")
    again = route(workflow=workflow, request=PING, client_request_id="batch-7:line-3")
    assert again.replayed and again.request_id == first.request_id
    assert again.completion is not None and again.completion.text == "answer" and again.cost == first.cost
    assert server.behaviour.total_calls() == 1
    assert UsageRecord.objects.count() == 2  # input + output of the one call


def test_disabled_deployment_is_left_out(
    admin_user: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    server = mock_provider()
    off, on = priced_deployment(server), priced_deployment(server)
    workflow = routed_workflow(admin_user, [off, on])
    off.enabled = False
    off.save(update_fields=["enabled"])
    assert route(workflow=workflow, request=PING).deployment_slug == on.slug


def test_unpriced_deployment_answers_without_usage(
    admin_user: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    server = mock_provider()
    workflow = routed_workflow(admin_user, [make_deployment(base_url=server.base_url)])
    result = route(workflow=workflow, request=PING)
    assert result.ok and result.cost == 0 and UsageRecord.objects.count() == 0


def test_chaos_drill_switches_on_and_off_without_restart(
    admin_user: User, mock_provider: Callable[..., MockProviderServer], settings: Any
) -> None:
    from inference.services import chaos_config_set

    settings.INFERENCE_BREAKER_MIN_REQUESTS = 100
    primary_server, fallback_server = mock_provider(), mock_provider()
    primary, fallback = priced_deployment(primary_server), priced_deployment(fallback_server)
    workflow = routed_workflow(admin_user, [primary, fallback])
    assert route(workflow=workflow, request=PING).deployment_slug == primary.slug
    chaos_config_set(deployment=primary, enabled=True, user=admin_user, error_rate=1.0, status_codes=[502])
    drilled = route(workflow=workflow, request=PING)
    assert drilled.deployment_slug == fallback.slug
    assert [(a.outcome, a.status_code) for a in drilled.attempts] == [
        (Outcome.RETRYABLE, 502),
        (Outcome.OK, 200),
    ]
    assert primary_server.behaviour.total_calls() == 1  # the injected error never reached it
    chaos_config_set(deployment=primary, enabled=False, user=admin_user)
    assert route(workflow=workflow, request=PING).deployment_slug == primary.slug


def test_chaos_settings_are_validated(admin_user: User) -> None:
    from inference.services import chaos_config_set
    from registry.services import RegistryError

    deployment = make_deployment()
    with pytest.raises(RegistryError, match="between 0 and 1"):
        chaos_config_set(deployment=deployment, enabled=True, user=admin_user, error_rate=1.5)
    with pytest.raises(RegistryError, match="HTTP codes"):
        chaos_config_set(deployment=deployment, enabled=True, user=admin_user, status_codes=[42])


def test_bedrock_deployment_is_routed_through_converse(admin_user: User) -> None:
    from registry.models import Provider
    from registry.services import provider_set_credentials
    from tests.factories import make_provider
    from tests.inference.converse_server import ConverseServer

    server = ConverseServer()
    try:
        provider = make_provider(kind=Provider.Kind.BEDROCK, base_url=server.url, region="eu-west-1")
        provider_set_credentials(provider=provider, credentials="AKIDTEST:not-a-real-secret")
        bedrock = priced_deployment(provider=provider, provider_model_id="anthropic.claude-test")
        workflow = routed_workflow(admin_user, [bedrock])
        result = route(workflow=workflow, request=PING)
    finally:
        server.stop()
    assert result.ok and result.completion is not None and result.completion.text == "hello from bedrock"
    assert server.behaviour.requests[-1][0] == "/model/anthropic.claude-test/converse"
    # 11 input tokens at $1/1M + 4 output tokens at $3/1M
    assert result.cost == Decimal("0.000023000")


def test_a_deployment_that_refuses_is_not_retried_in_later_rounds(
    admin_user: User, mock_provider: Callable[..., MockProviderServer], settings: Any
) -> None:
    settings.INFERENCE_BACKOFF_SECONDS = 0.01
    settings.INFERENCE_BREAKER_MIN_REQUESTS = 100
    unauthorised, overloaded = mock_provider(status=401), mock_provider(status=503)
    workflow = routed_workflow(admin_user, [priced_deployment(unauthorised), priced_deployment(overloaded)])
    result = route(workflow=workflow, request=PING)
    assert not result.ok
    # The 401 (a bad key: the deployment's fault) moved on without a retry; the 503 was retried.
    assert unauthorised.behaviour.total_calls() == 1 and overloaded.behaviour.total_calls() == 2
    assert [a.outcome for a in result.attempts] == [
        Outcome.NON_RETRYABLE,
        Outcome.RETRYABLE,
        Outcome.RETRYABLE,
    ]


def test_one_deployment_call_for_evals(
    admin_user: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    from inference.models import Endpoint

    first_server, second_server = mock_provider(), mock_provider(text="judged")
    first, second = priced_deployment(first_server), priced_deployment(second_server)
    workflow = routed_workflow(admin_user, [first, second])
    result = route(workflow=workflow, request=PING, endpoint=Endpoint.EVAL, deployment=second)
    assert result.ok and result.deployment_slug == second.slug and result.completion is not None
    assert result.completion.text == "judged" and first_server.behaviour.total_calls() == 0
    row = InferenceRequest.objects.get(pk=result.request_id)
    assert (row.endpoint, row.policy_version_id, row.deployment_id) == ("eval", None, second.pk)
    assert UsageRecord.objects.filter(subject_id=str(row.pk)).count() == 2
    # No fallback: a failing deployment fails the call.
    second_server.behaviour.status = 503
    failed = route(workflow=workflow, request=PING, endpoint=Endpoint.EVAL, deployment=second)
    assert not failed.ok and first_server.behaviour.total_calls() == 0


def test_successes_reach_the_shared_latency_samples(
    admin_user: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    from inference.breaker.breakers import breakers

    deployment = priced_deployment(mock_provider())
    workflow = routed_workflow(admin_user, [deployment])
    for _ in range(5):
        assert route(workflow=workflow, request=PING).ok
    # Recorded off the request path with Redis (at once in-process): wait for all five.
    deadline = time.monotonic() + 10
    while len(breakers().latencies([deployment.pk])[deployment.pk]) < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(breakers().latencies([deployment.pk])[deployment.pk]) == 5
    assert breaker_state(deployment.pk) == "closed"


def test_text_postgresql_cannot_store_is_recorded_with_replacement_characters(
    admin_user: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    # A byte-level local model can generate a NUL; PostgreSQL refuses NUL in text, which used
    # to fail the whole record (and the caller's request) for a batch line or a keyed request.
    server = mock_provider(text="a\x00b")
    workflow = routed_workflow(admin_user, [priced_deployment(server)])
    result = route(workflow=workflow, request=PING, client_request_id="test:nul")
    assert result.ok and result.completion is not None and result.completion.text == "a\x00b"
    row = InferenceRequest.objects.get(pk=result.request_id)
    assert row.response_text == "a\ufffdb"
    # The answer document kept for replays (jsonb refuses \u0000 too), and the prompt a
    # retaining workflow keeps: both stored with the replacement character.
    assert row.response_doc is not None
    assert row.response_doc["choices"][0]["message"]["content"] == "a\ufffdb"
    kept = routed_workflow(
        admin_user, [priced_deployment(server)], retain_prompts=True, prompt_retention_days=7
    )
    nul_prompt = ChatRequest(
        messages=(ChatMessage("user", "p\x00ng"),),
        wire={"messages": [{"role": "user", "content": "p\x00ng"}]},
    )
    assert route(workflow=kept, request=nul_prompt, retain=True).ok
    ledger_settled()
    retained = RetainedPrompt.objects.get(workflow=kept)
    assert retained.request["messages"][0]["content"] == "p\ufffdng" and retained.response_text == "a\ufffdb"
    assert db_text("bad \ud800 and \x00") == "bad ? and \ufffd"
    assert db_text("Grüße 😀") == "Grüße 😀"
