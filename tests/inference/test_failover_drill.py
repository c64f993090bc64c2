"""The failover drill: the primary fails 100% mid-traffic, a healthy fallback takes over.

Clients (the openai SDK, four threads, through the live gateway) see no error; the primary's
circuit opens; every failed call is a FailoverEvent, every answered call is billed; the ledger
total equals the sum of the requests' costs to the cent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import openai
import pytest
from django.contrib.auth.models import User

from bench.mockprovider import MockProviderServer
from billing.models import UsageRecord
from inference.breaker.breakers import breaker_state
from inference.models import InferenceAttempt, InferenceRequest
from registry.models import FailoverEvent
from registry.services import api_token_create
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow

Outcome = InferenceAttempt.Outcome


@pytest.mark.django_db(transaction=True)
def test_primary_fails_mid_traffic_clients_see_no_errors(
    live_server: Any, viewer: User, mock_provider: Callable[..., MockProviderServer], settings: Any
) -> None:
    settings.INFERENCE_BREAKER_MIN_REQUESTS = 5
    settings.INFERENCE_BREAKER_FAILURE_RATE = 0.5
    settings.INFERENCE_BREAKER_COOLDOWN_SECONDS = 60
    primary_server = mock_provider(tokens_in=1234, tokens_out=567)
    fallback_server = mock_provider(tokens_in=1234, tokens_out=567)
    primary = priced_deployment(primary_server, in_price=Decimal("2.5"), out_price=Decimal("10"))
    fallback = priced_deployment(fallback_server, in_price=Decimal("0.15"), out_price=Decimal("0.6"))
    workflow = routed_workflow(viewer, [primary, fallback])
    _, raw = api_token_create(user=viewer, name="drill")

    per_thread, threads_n = 30, 4
    errors: list[BaseException] = []
    served: list[str] = []
    lock = threading.Lock()
    half_done = threading.Barrier(threads_n)

    def client_loop() -> None:
        client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0)
        for i in range(per_thread):
            if i == per_thread // 2:
                # Every client is mid-traffic; one of them breaks the primary for all.
                if half_done.wait() == 0:
                    primary_server.behaviour.status = 503
                half_done.wait()
            try:
                reply = client.chat.completions.with_raw_response.create(
                    model=workflow.slug, messages=[{"role": "user", "content": f"req {i}"}]
                )
                with lock:
                    served.append(reply.headers["x-switchyard-deployment"])
            except BaseException as exc:  # noqa: BLE001 (collected and asserted below)
                with lock:
                    errors.append(exc)

    threads = [threading.Thread(target=client_loop) for _ in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    total = per_thread * threads_n
    assert len(served) == total
    assert served.count(primary.slug) == total // 2  # every request before the break
    assert breaker_state(primary.pk) == "open"

    ledger_settled()
    requests = InferenceRequest.objects.filter(workflow=workflow)
    assert requests.count() == total and not requests.exclude(status="succeeded").exists()
    attempts = InferenceAttempt.objects.filter(request__workflow=workflow)
    failed_calls = attempts.filter(outcome__in=[Outcome.RETRYABLE, Outcome.NON_RETRYABLE])
    assert primary_server.behaviour.total_calls() == total // 2 + failed_calls.count()
    # Once the circuit opened the primary was skipped, not called.
    assert attempts.filter(outcome=Outcome.CIRCUIT_OPEN, deployment=primary).exists()
    # The window held 20 successes: 10 failures reach the 50% rate (a few more may be in flight).
    assert 10 <= failed_calls.count() < total // 2

    # Every failed call that led to another is a FailoverEvent, with the right ends.
    events = FailoverEvent.objects.filter(kind="inference", subject__startswith="inference-request:")
    assert events.count() == failed_calls.count()
    assert set(events.values_list("from_deployment_id", "to_deployment_id", "status_code")) == {
        (primary.pk, fallback.pk, 503)
    }
    # Every answered call is billed (input + output rows), nothing else is.
    ok = attempts.filter(outcome=Outcome.OK)
    assert ok.count() == total
    usage = UsageRecord.objects.filter(workflow=workflow, subject_type="inference_request")
    assert usage.count() == 2 * ok.count()
    assert set(usage.values_list("subject_id", flat=True)) == {
        str(pk) for pk in requests.values_list("pk", flat=True)
    }
    # Summed as Decimals in Python: SQLite's SUM would go through floats.
    ledger_total = sum(usage.values_list("amount", flat=True), Decimal(0))
    request_total = sum(requests.values_list("cost", flat=True), Decimal(0))
    assert ledger_total == request_total > 0
    # Priced per deployment: the primary's requests cost more than the fallback's.
    per_primary = requests.filter(deployment=primary).first()
    per_fallback = requests.filter(deployment=fallback).first()
    assert per_primary is not None and per_fallback is not None
    assert per_primary.cost == Decimal("0.008755000") and per_fallback.cost == Decimal("0.000525300")
