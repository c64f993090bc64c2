"""The official openai SDK against a live gateway (pytest-django live_server) and a loopback provider."""

from __future__ import annotations

from collections.abc import Callable

import openai
import pytest
from django.contrib.auth.models import User

from bench.mockprovider import MockProviderServer
from inference.models import InferenceRequest
from registry.services import api_token_create
from tests.inference.helpers import priced_deployment, routed_workflow


@pytest.mark.django_db(transaction=True)
def test_openai_sdk_chat_stream_completion_models(
    live_server: object, viewer: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    server = mock_provider(text="hello there friend", tokens_in=5, tokens_out=3)
    deployment = priced_deployment(server)
    workflow = routed_workflow(viewer, [deployment])
    _, raw = api_token_create(user=viewer, name="sdk")
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0)  # type: ignore[attr-defined]

    chat = client.chat.completions.with_raw_response.create(
        model=workflow.slug, messages=[{"role": "user", "content": "hi"}], max_tokens=8
    )
    assert chat.headers["x-switchyard-deployment"] == deployment.slug
    parsed = chat.parse()
    assert parsed.choices[0].message.content == "hello there friend"
    assert parsed.usage is not None and parsed.usage.total_tokens == 8

    pieces = []
    stream_ids = set()
    with client.chat.completions.create(
        model=workflow.slug, messages=[{"role": "user", "content": "hi"}], stream=True
    ) as stream:
        for chunk in stream:
            stream_ids.add(chunk.id)
            if chunk.choices and chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
    assert "".join(pieces) == "hello there friend"

    completion = client.completions.create(model=workflow.slug, prompt="say hi")
    assert completion.choices[0].text == "hello there friend"

    assert [m.id for m in client.models.list()] == [workflow.slug]

    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="missing", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{live_server.url}/v1", api_key="sy_bad_key", max_retries=0).models.list()  # type: ignore[attr-defined]

    rows = InferenceRequest.objects.filter(workflow=workflow)
    assert sorted(rows.values_list("endpoint", "stream")) == [
        ("chat", False),
        ("chat", True),
        ("completion", False),
    ]
    assert all(r.status == "succeeded" and r.deployment_id == deployment.pk for r in rows)
    # Plain and streamed answers carry one id shape: the recorded request's own id.
    plain_chat, streamed = rows.get(endpoint="chat", stream=False), rows.get(stream=True)
    assert parsed.id == f"chatcmpl-sy{plain_chat.pk}"
    assert stream_ids == {f"chatcmpl-sy{streamed.pk}"}
    assert completion.id == f"cmpl-sy{rows.get(endpoint='completion').pk}"
