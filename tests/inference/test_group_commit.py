"""Concurrent requests are recorded together (group commit) and each exactly once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from bench.mockprovider import MockProviderServer
from billing.models import UsageRecord
from inference.adapters.base import ChatMessage, ChatRequest
from inference.models import InferenceAttempt, InferenceRequest
from inference.router.entry import route
from inference.router.errors import RouteResult
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow

PING = ChatRequest(messages=(ChatMessage("user", "ping"),))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "recording",
    [
        "inline",  # SQLite's (the embedded demo's) recording: group commit
        pytest.param("journal", marks=pytest.mark.postgres),  # PostgreSQL's: folded after answering
    ],
)
def test_concurrent_requests_are_each_recorded_and_billed_once(
    admin_user: User, mock_provider: Callable[..., MockProviderServer], settings: Any, recording: str
) -> None:
    settings.INFERENCE_RECORDING = recording
    server = mock_provider(tokens_in=100, tokens_out=10, delay_ms=5)
    workflow = routed_workflow(admin_user, [priced_deployment(server)])
    results: list[RouteResult] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def worker(i: int) -> None:
        try:
            start.wait()
            for j in range(10):
                # Threads 0 and 1 send the same idempotency keys (a retried batch line).
                key = f"line-{j}" if i < 2 else None
                result = route(workflow=workflow, request=PING, client_request_id=key)
                with lock:
                    results.append(result)
        except BaseException as exc:  # noqa: BLE001 (asserted below)
            with lock:
                errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    assert len(results) == 80 and all(r.ok for r in results)
    rows = InferenceRequest.objects.filter(workflow=workflow)
    assert rows.count() == 70  # 60 plain requests + 10 distinct idempotency keys
    keyed = {r.client_request_id: r.pk for r in rows.exclude(client_request_id=None)}
    assert sorted(keyed) == sorted(f"line-{j}" for j in range(10))
    for r in results:
        assert r.request_id in set(rows.values_list("pk", flat=True))
    ledger_settled()
    usage = UsageRecord.objects.filter(workflow=workflow)
    assert usage.count() == 2 * 70
    assert sum(usage.values_list("amount", flat=True), Decimal(0)) == sum(
        rows.values_list("cost", flat=True), Decimal(0)
    )
    assert InferenceAttempt.objects.filter(request__workflow=workflow).count() == 70


def test_recording_inside_a_callers_transaction_stays_in_it(
    db: Any, admin_user: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    from django.db import transaction

    workflow = routed_workflow(admin_user, [priced_deployment(mock_provider())])
    with pytest.raises(RuntimeError), transaction.atomic():
        route(workflow=workflow, request=PING)
        assert InferenceRequest.objects.count() == 1
        raise RuntimeError("the caller rolls back")
    assert InferenceRequest.objects.count() == 0 and UsageRecord.objects.count() == 0
