"""Capabilities per deployment: the router skips a deployment that cannot serve what a request
needs, and the gateway answers 400 when no deployment of the route can."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from inference.models import InferenceAttempt
from registry.models import Provider
from registry.services import api_token_create
from tests.factories import make_provider
from tests.helpers import ledger_settled
from tests.inference.converse_server import ConverseServer
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.inference.recording_provider import RecordingProvider, chat_answer

pytestmark = pytest.mark.django_db(transaction=True)

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}


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


def _post(user: User, workflow: str, **fields: Any) -> Any:
    _, raw = api_token_create(user=user, name="capabilities")
    body = json.dumps({"model": workflow, "messages": [{"role": "user", "content": "hi"}], **fields})
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
        "/v1/chat/completions", body, content_type="application/json"
    )


def test_a_tool_request_skips_a_deployment_without_tools_and_never_gets_plain_text(
    viewer: User, providers: Callable[[], RecordingProvider]
) -> None:
    plain, able = providers(), providers()
    able.script.answer = chat_answer(None, tool_calls=[CALL], finish_reason="tool_calls")
    route = [
        priced_deployment(base_url=plain.base_url, supports_tools=False),
        priced_deployment(base_url=able.base_url),
    ]
    workflow = routed_workflow(viewer, route)
    response = _post(viewer, workflow.slug, tools=[TOOL])
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["tool_calls"] == [CALL]
    assert plain.script.calls() == 0
    ledger_settled()
    skipped = InferenceAttempt.objects.get(deployment=route[0])
    assert (skipped.outcome, skipped.error) == ("unsupported", "cannot serve tools")
    # A request without tools still goes to the first deployment.
    assert _post(viewer, workflow.slug)["x-switchyard-deployment"] == route[0].slug


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [TOOL]}, "tools"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object"}},
                }
            },
            "response_format",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
                        ],
                    }
                ]
            },
            "messages",
        ),
        ({"max_tokens": 5000}, "max_tokens"),
    ],
)
def test_when_no_deployment_can_serve_the_request_it_is_400_before_any_call(
    viewer: User, providers: Callable[[], RecordingProvider], fields: dict[str, Any], param: str
) -> None:
    provider = providers()
    deployment = priced_deployment(
        base_url=provider.base_url, supports_tools=False, supports_json_schema=False, max_context_tokens=4096
    )
    workflow = routed_workflow(viewer, [deployment])
    response = _post(viewer, workflow.slug, **fields)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_feature", param)
    assert provider.script.calls() == 0


def test_a_bedrock_deployment_serves_tools_only_as_declared(
    viewer: User, providers: Callable[[], RecordingProvider]
) -> None:
    # Bedrock maps tools to Converse, but a deployment declared without them is still skipped.
    bedrock = priced_deployment(
        base_url="http://127.0.0.1:9",
        provider=make_provider(kind=Provider.Kind.BEDROCK),
        supports_tools=False,
    )
    able = providers()
    workflow = routed_workflow(viewer, [bedrock, priced_deployment(base_url=able.base_url)])
    assert _post(viewer, workflow.slug, tools=[TOOL]).status_code == 200
    ledger_settled()
    skipped = InferenceAttempt.objects.get(deployment=bedrock)
    assert (skipped.outcome, skipped.error) == ("unsupported", "cannot serve tools")


def test_tool_arguments_that_are_not_a_json_object_skip_bedrock_for_a_deployment_that_carries_them(
    viewer: User, providers: Callable[[], RecordingProvider]
) -> None:
    # Converse's toolUse.input is a JSON object; an OpenAI-compatible provider takes the
    # arguments as the model once wrote them, so the request goes there, unchanged.
    converse = ConverseServer()
    try:
        bedrock = priced_deployment(
            provider=make_provider(kind=Provider.Kind.BEDROCK, base_url=converse.url), provider_model_id="m"
        )
        able = providers()
        workflow = routed_workflow(viewer, [bedrock, priced_deployment(base_url=able.base_url)])
        call = {**CALL, "function": {"name": "lookup", "arguments": "{not json"}}
        messages = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "found"},
        ]
        response = _post(viewer, workflow.slug, messages=messages, tools=[TOOL])
    finally:
        converse.stop()
    assert response.status_code == 200, response.content
    assert able.script.last_body["messages"][1]["tool_calls"] == [call]
    assert converse.behaviour.requests == []
    ledger_settled()
    skipped = InferenceAttempt.objects.get(deployment=bedrock)
    assert (skipped.outcome, skipped.error) == (
        "unsupported",
        "cannot serve tool call arguments that are not a JSON object",
    )
