"""POST /v1/embeddings: the SDK's embeddings.create, routing within one embedding model, billing
per input token."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import openai
import pytest
from django.contrib.auth.models import User
from django.db.models import Sum
from django.test import Client

from billing.models import Unit, UsageRecord
from inference.models import InferenceRequest
from registry.services import api_token_create
from tests.factories import make_model
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.inference.recording_provider import RecordingProvider

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def providers() -> Iterator[Callable[[], RecordingProvider]]:
    started: list[RecordingProvider] = []

    def start() -> RecordingProvider:
        server = RecordingProvider()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _client(user: User) -> Client:
    _, raw = api_token_create(user=user, name="embeddings")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def test_the_sdk_gets_the_providers_vectors_and_the_request_is_billed_per_input_token(
    live_server: Any, operator: User, providers: Callable[[], RecordingProvider]
) -> None:
    provider = providers()
    deployment = priced_deployment(
        base_url=provider.base_url, provider_model_id="embed-small", supports_embeddings=True
    )
    workflow = routed_workflow(operator, [deployment])
    _, raw = api_token_create(user=operator, name="sdk")
    direct = openai.OpenAI(base_url=provider.base_url, api_key="k", max_retries=0)
    via = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0)
    kwargs: dict[str, Any] = {"input": ["first text", "second text"], "dimensions": 3, "user": "u-1"}

    straight = direct.embeddings.create(model="embed-small", encoding_format="float", **kwargs)
    sent_direct = provider.script.last_body
    raw_response = via.embeddings.with_raw_response.create(
        model=workflow.slug, encoding_format="float", **kwargs
    )
    through = raw_response.parse()
    assert provider.script.last_body == sent_direct
    assert [d.embedding for d in through.data] == [[0.25, -0.5, 0.125]] * 2
    assert through.model_dump(exclude={"model"}) == straight.model_dump(exclude={"model"})
    assert through.model == workflow.slug

    ledger_settled()
    row = InferenceRequest.objects.get()
    assert (row.endpoint, row.tokens_in, row.tokens_out) == ("embedding", 8, 0)
    records = UsageRecord.objects.filter(subject_id=str(row.pk))
    assert [(r.unit, r.quantity) for r in records] == [(Unit.INPUT_TOKENS_1M, Decimal("0.000008"))]
    assert row.cost == Decimal("0.000008000") == records.aggregate(t=Sum("amount"))["t"]
    assert raw_response.headers["x-switchyard-cost"] == f"{row.cost:f}"


def test_failover_stays_within_the_embedding_model_of_the_route(
    viewer: User, providers: Callable[[], RecordingProvider]
) -> None:
    small, large = make_model(slug="embed-small"), make_model(slug="embed-large")
    failing, other_model, same_model = providers(), providers(), providers()
    failing.script.status = 503
    route = [
        priced_deployment(base_url=failing.base_url, model=small, supports_embeddings=True),
        priced_deployment(base_url=other_model.base_url, model=large, supports_embeddings=True),
        priced_deployment(base_url=same_model.base_url, model=small, supports_embeddings=True),
    ]
    workflow = routed_workflow(viewer, route)
    body = json.dumps({"model": workflow.slug, "input": "text"})

    response = _client(viewer).post("/v1/embeddings", body, content_type="application/json")
    assert response.status_code == 200
    assert response["x-switchyard-deployment"] == route[2].slug
    assert other_model.script.calls() == 0  # another model's vectors would corrupt the store

    same_model.script.status = 503
    response = _client(viewer).post("/v1/embeddings", body, content_type="application/json")
    assert response.status_code == 502
    assert other_model.script.calls() == 0


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": [1, "a"]}, "input"),
        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
    ],
)
def test_bad_embedding_input_is_400_before_any_call(
    viewer: User, providers: Callable[[], RecordingProvider], fields: dict[str, Any], param: str
) -> None:
    provider = providers()
    deployment = priced_deployment(base_url=provider.base_url, supports_embeddings=True)
    workflow = routed_workflow(viewer, [deployment])
    body = json.dumps({"model": workflow.slug, **fields})
    response = _client(viewer).post("/v1/embeddings", body, content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]["param"] == param
    assert provider.script.calls() == 0 and not InferenceRequest.objects.exists()
