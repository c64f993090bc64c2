"""Billing what providers report: cached input and reasoning tokens as their own ledger units,
and the request's cost where the caller can read it (a header, or the stream's last event)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db.models import Sum
from django.test import Client

from billing.models import Unit, UsageRecord
from inference.models import InferenceRequest
from registry.services import api_token_create
from tests.factories import make_price
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.inference.recording_provider import RecordingProvider, chat_answer

pytestmark = pytest.mark.django_db(transaction=True)

USAGE = {
    "prompt_tokens": 2000,
    "completion_tokens": 300,
    "total_tokens": 2300,
    "prompt_tokens_details": {"cached_tokens": 1536},
    "completion_tokens_details": {"reasoning_tokens": 256},
}
BODY = {"messages": [{"role": "user", "content": "think"}]}


@pytest.fixture
def provider() -> Iterator[RecordingProvider]:
    server = RecordingProvider()
    server.script.answer = chat_answer("done", usage=USAGE)
    yield server
    server.stop()


def _post(user: User, workflow: str, **extra: Any) -> Any:
    _, raw = api_token_create(user=user, name="billing")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    body = json.dumps({"model": workflow, **BODY, **extra})
    return client.post("/v1/chat/completions", body, content_type="application/json")


def _ledger(row: InferenceRequest) -> dict[str, tuple[Decimal, Decimal]]:
    ledger_settled()
    records = UsageRecord.objects.filter(subject_type="inference_request", subject_id=str(row.pk))
    return {r.unit: (r.quantity, r.amount) for r in records}


def _ledger_equals_requests() -> None:
    ledger_settled()
    ledger = UsageRecord.objects.aggregate(total=Sum("amount"))["total"]
    assert ledger == InferenceRequest.objects.aggregate(total=Sum("cost"))["total"]


def test_cached_and_reasoning_tokens_are_billed_at_their_own_prices(
    operator: User, provider: RecordingProvider
) -> None:
    deployment = priced_deployment(base_url=provider.base_url)  # $1 in, $3 out per 1M
    make_price(unit=Unit.CACHED_INPUT_TOKENS_1M, unit_price=Decimal("0.25"), deployment=deployment)
    make_price(unit=Unit.REASONING_TOKENS_1M, unit_price=Decimal("5"), deployment=deployment)
    workflow = routed_workflow(operator, [deployment])

    response = _post(operator, workflow.slug)
    assert response.status_code == 200
    # The provider's usage details come back to the caller as they were.
    assert response.json()["usage"] == USAGE
    row = InferenceRequest.objects.get()
    assert _ledger(row) == {
        Unit.INPUT_TOKENS_1M: (Decimal("0.000464"), Decimal("0.000464000")),  # 464 uncached × $1
        Unit.CACHED_INPUT_TOKENS_1M: (Decimal("0.001536"), Decimal("0.000384000")),  # 1536 × $0.25
        Unit.OUTPUT_TOKENS_1M: (Decimal("0.000044"), Decimal("0.000132000")),  # 44 × $3
        Unit.REASONING_TOKENS_1M: (Decimal("0.000256"), Decimal("0.001280000")),  # 256 × $5
    }
    assert row.cost == Decimal("0.002260000")
    assert response["x-switchyard-cost"] == f"{row.cost:f}"
    _ledger_equals_requests()


def test_without_a_cached_or_reasoning_price_they_are_billed_as_input_and_output(
    operator: User, provider: RecordingProvider
) -> None:
    workflow = routed_workflow(operator, [priced_deployment(base_url=provider.base_url)])
    assert _post(operator, workflow.slug).status_code == 200
    row = InferenceRequest.objects.get()
    assert _ledger(row) == {
        Unit.INPUT_TOKENS_1M: (Decimal("0.002"), Decimal("0.002000000")),
        Unit.OUTPUT_TOKENS_1M: (Decimal("0.0003"), Decimal("0.000900000")),
    }
    _ledger_equals_requests()


def test_a_streamed_answer_carries_its_cost_in_its_last_event(
    operator: User, provider: RecordingProvider
) -> None:
    deployment = priced_deployment(base_url=provider.base_url)
    make_price(unit=Unit.CACHED_INPUT_TOKENS_1M, unit_price=Decimal("0.25"), deployment=deployment)
    workflow = routed_workflow(operator, [deployment])
    response = _post(operator, workflow.slug, stream=True, stream_options={"include_usage": True})
    assert response.status_code == 200
    events = b"".join(response.streaming_content).decode().split("\n\n")
    docs = [json.loads(e[6:]) for e in events if e.startswith("data: {")]
    assert events[-2] == "data: [DONE]"
    assert all("switchyard" not in d for d in docs[:-1])
    last = docs[-1]
    assert last["usage"] == USAGE
    row = InferenceRequest.objects.get()
    assert last["switchyard"] == {
        "request_id": row.pk,
        "deployment": deployment.slug,
        "cost": f"{row.cost:f}",
        "currency": "USD",
    }
    # 464 × $1 + 1536 × $0.25 + 300 × $3 (no reasoning price: reasoning tokens are output)
    assert row.cost == Decimal("0.001748000") and row.stream
    assert set(_ledger(row)) == {Unit.INPUT_TOKENS_1M, Unit.CACHED_INPUT_TOKENS_1M, Unit.OUTPUT_TOKENS_1M}
    _ledger_equals_requests()


def test_a_viewers_stream_names_its_request_but_not_its_cost(
    viewer: User, provider: RecordingProvider
) -> None:
    # Viewers see no money (registry.auth.roles.can_see_costs): not in the header, not in the stream.
    deployment = priced_deployment(base_url=provider.base_url)
    workflow = routed_workflow(viewer, [deployment])
    response = _post(viewer, workflow.slug, stream=True)
    assert response.status_code == 200
    events = b"".join(response.streaming_content).decode().split("\n\n")
    last = json.loads([e for e in events if e.startswith("data: {")][-1][6:])
    row = InferenceRequest.objects.get()
    assert last["switchyard"] == {"request_id": row.pk, "deployment": deployment.slug}
    assert row.cost > 0 and "x-switchyard-cost" not in response
