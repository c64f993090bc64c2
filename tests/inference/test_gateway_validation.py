"""Input no provider can take is refused by the gateway with a 400 naming the field, before any
workflow look-up or provider call (inference.gateway.openai_request); valid requests are unchanged."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from bench.mockprovider import MockProviderServer
from inference.adapters.base import ChatMessage, ChatRequest
from inference.models import InferenceRequest
from registry.services import api_token_create
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db

SURROGATE = "hi \ud800"  # json.dumps writes it as the escape "hi \\ud800": valid JSON, not Unicode
USER = [{"role": "user", "content": "ping"}]
PING = ChatRequest(messages=(ChatMessage("user", "ping"),))


def _client(user: User) -> Client:
    _, raw = api_token_create(user=user, name="gateway")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


CHAT_CASES: list[tuple[dict[str, Any], str, str | None]] = [
    # (body fields over {"model": <workflow>, "messages": USER}, code, param)
    ({"messages": [{"role": "user", "content": SURROGATE}]}, "invalid_unicode", "messages[0].content"),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": SURROGATE}]}]},
        "invalid_unicode",
        "messages[0].content[0].text",
    ),
    ({"messages": [{"role": "user\ud800", "content": "x"}]}, "invalid_unicode", "messages[0].role"),
    ({"model": "wf-\udfff"}, "invalid_unicode", "model"),
    ({"user": SURROGATE}, "invalid_unicode", "user"),
    ({"stop": ["ok", SURROGATE]}, "invalid_unicode", "stop[1]"),
    ({"metadata": {"note": SURROGATE}}, "invalid_unicode", "metadata.note"),
    ({"\ud800": 1}, "invalid_unicode", "\\ud800"),
    ({"model": "a\u0000"}, "invalid_model", "model"),
    ({"model": "wf\nx"}, "invalid_model", "model"),
    ({"model": "w" * 300}, "invalid_model", "model"),
    ({"model": 7}, "invalid_model", "model"),
    ({"messages": [{"role": "user", "content": 5}]}, "invalid_messages", "messages[0].content"),
    ({"messages": [{"role": "user", "content": {"text": "x"}}]}, "invalid_messages", "messages[0].content"),
    ({"messages": [{"role": "user", "content": None}]}, "invalid_messages", "messages[0].content"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]},
        "invalid_messages",
        "messages[0].content[0].image_url",
    ),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}, "invalid_messages", None),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "invalid_messages", "messages[0].role"),
    ({"messages": [{"content": "x"}]}, "invalid_messages", "messages[0].role"),
    ({"messages": ["hello"]}, "invalid_messages", "messages[0]"),
    ({"messages": {"role": "user"}}, "invalid_messages", "messages"),
    ({"stream_options": "yes", "stream": True}, "invalid_stream_options", "stream_options"),
    ({"stream_options": [], "stream": True}, "invalid_stream_options", "stream_options"),
    (
        {"stream_options": {"include_usage": "yes"}, "stream": True},
        "invalid_stream_options",
        "stream_options.include_usage",
    ),
    ({"stream": "true"}, "invalid_stream", "stream"),
    ({"n": True}, "invalid_n", "n"),
    ({"n": 1.5}, "invalid_n", "n"),
    ({"n": 0}, "invalid_n", "n"),
    ({"n": 129}, "invalid_n", "n"),
    # The fields carried to the provider unchanged still have their types checked here.
    ({"tools": {"type": "function"}}, "invalid_tools", "tools"),
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "invalid_tools", "tools[0].function"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
        "invalid_tools",
        "tools[0].function.parameters",
    ),
    ({"tool_choice": 3}, "invalid_tool_choice", "tool_choice"),
    ({"parallel_tool_calls": "no"}, "invalid_parallel_tool_calls", "parallel_tool_calls"),
    ({"response_format": "json"}, "invalid_response_format", "response_format"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
        "invalid_response_format",
        "response_format.json_schema",
    ),
    ({"logprobs": 1}, "invalid_logprobs", "logprobs"),
    ({"top_logprobs": 21}, "invalid_top_logprobs", "top_logprobs"),
    ({"metadata": {"k": 1}}, "invalid_metadata", "metadata.k"),
    ({"modalities": "text"}, "invalid_modalities", "modalities"),
    ({"logit_bias": {"1": 101}}, "invalid_logit_bias", "logit_bias.1"),
    (
        {"messages": [{"role": "tool", "content": "21"}]},
        "invalid_messages",
        "messages[0].tool_call_id",
    ),
    (
        {
            "messages": [
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]}
            ]
        },
        "invalid_messages",
        "messages[0].tool_calls[0]",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"detail": "low"}}]}]},
        "invalid_messages",
        "messages[0].content[0].image_url.url",
    ),
    ({"max_tokens": True}, "invalid_max_tokens", "max_tokens"),
    ({"max_tokens": 2.5}, "invalid_max_tokens", "max_tokens"),
    ({"max_tokens": 0}, "invalid_max_tokens", "max_tokens"),
    ({"max_tokens": 10**30}, "invalid_max_tokens", "max_tokens"),
    ({"max_completion_tokens": -1}, "invalid_max_tokens", "max_completion_tokens"),
    ({"temperature": True}, "invalid_temperature", "temperature"),
    ({"temperature": "0.5"}, "invalid_temperature", "temperature"),
    ({"temperature": -0.1}, "invalid_temperature", "temperature"),
    ({"temperature": 2.5}, "invalid_temperature", "temperature"),
    ({"top_p": 1.5}, "invalid_top_p", "top_p"),
    ({"top_p": False}, "invalid_top_p", "top_p"),
    ({"presence_penalty": 3}, "invalid_presence_penalty", "presence_penalty"),
    ({"frequency_penalty": True}, "invalid_frequency_penalty", "frequency_penalty"),
    ({"seed": True}, "invalid_seed", "seed"),
    ({"seed": 2**70}, "invalid_seed", "seed"),
    ({"user": 5}, "invalid_user", "user"),
    ({"stop": [1]}, "invalid_stop", "stop"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "invalid_stop", "stop"),
]


@pytest.mark.parametrize(("fields", "code", "param"), CHAT_CASES)
def test_chat_input_no_provider_can_take_is_400_before_any_call(
    viewer: User,
    mock_provider: Callable[..., MockProviderServer],
    fields: dict[str, Any],
    code: str,
    param: str | None,
) -> None:
    server = mock_provider()
    workflow = routed_workflow(viewer, [priced_deployment(server)])
    body = {"model": workflow.slug, "messages": USER, **fields}
    response = _client(viewer).post("/v1/chat/completions", json.dumps(body), content_type="application/json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", code)
    if param is not None:
        assert error["param"] == param
    assert server.behaviour.total_calls() == 0 and not InferenceRequest.objects.exists()


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"prompt": SURROGATE}, "invalid_unicode", "prompt"),
        ({"prompt": [SURROGATE]}, "invalid_unicode", "prompt[0]"),
        ({"prompt": ["a", "b"]}, "invalid_prompt", "prompt"),
        ({"prompt": [1, 2, 3]}, "invalid_prompt", "prompt"),
        ({"prompt": None}, "invalid_prompt", "prompt"),
        ({"n": True}, "invalid_n", "n"),
        ({"stream_options": 1, "stream": True}, "invalid_stream_options", "stream_options"),
        ({"model": "a\u0000"}, "invalid_model", "model"),
    ],
)
def test_completion_input_no_provider_can_take_is_400_before_any_call(
    viewer: User,
    mock_provider: Callable[..., MockProviderServer],
    fields: dict[str, Any],
    code: str,
    param: str,
) -> None:
    server = mock_provider()
    workflow = routed_workflow(viewer, [priced_deployment(server)])
    body = {"model": workflow.slug, "prompt": "x", **fields}
    response = _client(viewer).post("/v1/completions", json.dumps(body), content_type="application/json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param)
    assert server.behaviour.total_calls() == 0 and not InferenceRequest.objects.exists()


def test_valid_edge_requests_still_answer(
    viewer: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    server = mock_provider(text="pong")
    workflow = routed_workflow(viewer, [priced_deployment(server)])
    client = _client(viewer)
    bodies: list[tuple[str, dict[str, Any]]] = [
        (
            "/v1/chat/completions",
            {
                "model": workflow.slug,
                "messages": [
                    {"role": "system", "content": "Réponds en français 😀"},
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    },
                    {"role": "assistant", "content": None},
                    {"role": "user", "content": "nul \u0000 and tab \t are text"},
                ],
                "n": 1,
                "max_tokens": 1,
                "max_completion_tokens": 8,
                "temperature": 0,
                "top_p": 1,
                "stop": "\n",
                "seed": -3,
                "user": "end-user-1",
                "presence_penalty": -2,
                "stream": False,
                "stream_options": None,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            },
        ),
        ("/v1/completions", {"model": workflow.slug, "prompt": ["one"], "temperature": 2.0, "stop": []}),
    ]
    for path, body in bodies:
        response = client.post(path, json.dumps(body), content_type="application/json")
        assert response.status_code == 200, response.content
    sent = server.behaviour.last_body
    # Carried as the client wrote it (a list of one string), not rewritten.
    assert sent["prompt"] == ["one"] and sent["temperature"] == 2.0
    assert InferenceRequest.objects.filter(status="succeeded").count() == 2


def test_a_token_with_control_characters_is_401_not_a_database_error(viewer: User) -> None:
    response = Client(HTTP_AUTHORIZATION="Bearer sy_ab\x00cd_secret").get("/v1/models")
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("key", ["k\x00y", "k" * 101, "k" * 129, ""])
def test_a_bad_idempotency_key_is_400(
    viewer: User, mock_provider: Callable[..., MockProviderServer], key: str
) -> None:
    server = mock_provider()
    workflow = routed_workflow(viewer, [priced_deployment(server)])
    body = json.dumps({"model": workflow.slug, "messages": USER})
    response = _client(viewer).post(
        "/v1/chat/completions", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_idempotency_key"
    assert server.behaviour.total_calls() == 0
    assert not InferenceRequest.objects.exists()
