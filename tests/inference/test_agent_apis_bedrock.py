"""Anthropic's Messages and OpenAI's Responses routed to a Bedrock deployment: the body is
translated to chat, the Bedrock adapter sends it to Converse (a loopback server, boto3's
endpoint_url), and the answer comes back in the caller's API, plain and streamed, with the tool
call Converse made."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from django.contrib.auth.models import User

from inference.models import InferenceRequest
from registry.models import Provider, Workflow
from registry.services import api_token_create, provider_set_credentials
from tests.factories import make_provider
from tests.inference.converse_server import ConverseServer
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db(transaction=True)

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL_USE = {"toolUse": {"toolUseId": "tooluse_paris", "name": "get_weather", "input": {"city": "Paris"}}}


@pytest.fixture
def converse() -> Iterator[ConverseServer]:
    server = ConverseServer()
    server.behaviour.blocks = [{"text": "Looking it up."}, TOOL_USE]
    server.behaviour.stop_reason = "tool_use"
    yield server
    server.stop()


@pytest.fixture
def routed(live_server: Any, operator: User, converse: ConverseServer) -> tuple[str, Workflow, str]:
    """(the live server's URL, a workflow routed to a Bedrock deployment, a key)."""
    provider = make_provider(kind=Provider.Kind.BEDROCK, base_url=converse.url, region="eu-west-1")
    provider_set_credentials(provider=provider, credentials="AKIDTEST:not-a-real-secret")
    deployment = priced_deployment(provider=provider, provider_model_id="anthropic.claude-test")
    _, raw = api_token_create(user=operator, name="agents")
    return live_server.url, routed_workflow(operator, [deployment]), raw


def _converse_sent(converse: ConverseServer, *, stream: bool) -> dict[str, Any]:
    path, body = converse.behaviour.requests[-1]
    assert path == f"/model/anthropic.claude-test/{'converse-stream' if stream else 'converse'}"
    return body


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_messages_reach_converse_and_the_tool_call_comes_back_as_tool_use(
    routed: tuple[str, Workflow, str], converse: ConverseServer, stream: bool
) -> None:
    url, workflow, raw = routed
    client = anthropic.Anthropic(base_url=url, api_key=raw, max_retries=0)
    kwargs: dict[str, Any] = {
        "model": workflow.slug,
        "max_tokens": 64,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"name": "get_weather", "input_schema": SCHEMA}],
    }
    if stream:
        with client.messages.stream(**kwargs) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**kwargs)
    body = _converse_sent(converse, stream=stream)
    assert body["system"] == [{"text": "Be brief."}]
    assert body["messages"] == [{"role": "user", "content": [{"text": "Weather in Paris?"}]}]
    assert body["toolConfig"]["tools"][0]["toolSpec"]["name"] == "get_weather"
    assert [b.type for b in message.content] == ["text", "tool_use"]
    assert message.content[0].text == "Looking it up."  # type: ignore[union-attr]
    use = message.content[1]
    assert (use.id, use.name, use.input) == ("tooluse_paris", "get_weather", {"city": "Paris"})  # type: ignore[union-attr]
    assert message.stop_reason == "tool_use"
    row = InferenceRequest.objects.get()
    assert message.id == f"msg_sy{row.pk}" and (row.tokens_in, row.tokens_out) == (11, 4)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (11, 4)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_responses_reach_converse_and_the_tool_call_comes_back_as_a_function_call(
    routed: tuple[str, Workflow, str], converse: ConverseServer, stream: bool
) -> None:
    url, workflow, raw = routed
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=raw, max_retries=0)
    kwargs: dict[str, Any] = {
        "model": workflow.slug,
        "instructions": "Be brief.",
        "input": "Weather in Paris?",
        "tools": [{"type": "function", "name": "get_weather", "parameters": SCHEMA}],
    }
    if stream:
        with client.responses.stream(**kwargs) as events:
            response = events.get_final_response()
    else:
        response = client.responses.create(**kwargs)
    body = _converse_sent(converse, stream=stream)
    assert body["system"] == [{"text": "Be brief."}]
    assert body["toolConfig"]["tools"][0]["toolSpec"]["name"] == "get_weather"
    assert response.output_text == "Looking it up."
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert (call.call_id, call.name, json.loads(call.arguments)) == (
        "tooluse_paris",
        "get_weather",
        {"city": "Paris"},
    )
    row = InferenceRequest.objects.get()
    assert response.id == f"resp_sy{row.pk}" and response.usage.total_tokens == 15
