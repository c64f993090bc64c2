"""Malformed /v1/messages and /v1/responses bodies: each is a 400 naming the field, in the API's
own error shape, before any provider is called; no shape of JSON makes either answer a 500."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from inference.models import InferenceRequest
from registry.services import api_token_create
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db

USER = {"role": "user", "content": "hi"}

# (body fields over a valid body, the param the 400 names)
MESSAGES = [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [1]}, "messages[0]"),
    ({"messages": [{"role": "user"}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content"),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
        "messages[0].content[0].text",
    ),
    ({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}, "messages[0].content[0]"),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/tiff", "data": "AA"},
                        }
                    ],
                }
            ]
        },
        "messages[0].content[0].source.media_type",
    ),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}}],
                }
            ]
        },
        "messages[0].content[0].source.url",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": 3}]}]},
        "messages[0].content[0].tool_use_id",
    ),
    (
        {
            "messages": [
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}
            ]
        },
        "messages[0].content[0].input",
    ),
    ({"system": 5}, "system"),
    ({"system": [{"type": "image"}]}, "system[0].type"),
    ({"max_tokens": "8"}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"tools": {"name": "f"}}, "tools"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "f", "input_schema": {}, "description": 3}]}, "tools[0].description"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
    (
        {"tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}},
        "tool_choice.disable_parallel_tool_use",
    ),
    ({"stop_sequences": "END"}, "stop_sequences"),
    ({"temperature": "hot"}, "temperature"),
    ({"metadata": []}, "metadata"),
    ({"metadata": {"user_id": 7}}, "metadata.user_id"),
    ({"stream": "yes"}, "stream"),
    ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
    ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format.schema"),
    ({"model": 5}, "model"),
    # A final assistant turn (a prefill) would be answered after, not continued.
    ({"messages": [USER, {"role": "assistant", "content": '{"a":'}]}, "messages[1].role"),
]
RESPONSES = [
    ({"input": []}, "input"),
    ({"input": 5}, "input"),
    ({"input": [5]}, "input[0]"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    (
        {"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]},
        "input[0].content[0].type",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
        "input[0].content[0].image_url",
    ),
    (
        {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]},
        "input[0].arguments",
    ),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"instructions": ["be brief"]}, "instructions"),
    ({"tools": "f"}, "tools"),
    ({"tools": [{"type": "function", "name": "f", "defer_loading": True}]}, "tools[0].defer_loading"),
    ({"tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
    ({"text": "json"}, "text"),
    ({"text": {"format": {"type": "json_schema"}}}, "text.format"),
    ({"text": {"colour": "red"}}, "text.colour"),
    ({"reasoning": "high"}, "reasoning"),
    ({"reasoning": {"effort": 5}}, "reasoning.effort"),
    ({"max_output_tokens": "many"}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"store": "yes"}, "store"),
    ({"stream": 1}, "stream"),
    ({"metadata": "x"}, "metadata"),
    ({"model": None}, "model"),
    (
        {
            "input": [
                {"role": "user", "content": [{"type": "input_image", "image_url": "file:///etc/passwd"}]}
            ]
        },
        "input[0].content[0].image_url",
    ),
    (
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": "https://x.test/a.png", "detail": {"a": 1}}
                    ],
                }
            ]
        },
        "input[0].content[0].detail",
    ),
    ({"text": {"verbosity": {"a": 1}}}, "text.verbosity"),
    ({"stream_options": "x"}, "stream_options"),
    ({"prompt_cache_key": 5}, "prompt_cache_key"),
    ({"safety_identifier": 5}, "safety_identifier"),
    ({"tools": [{"type": "function", "name": "f", "description": 3}]}, "tools[0].description"),
]


@pytest.fixture
def client(viewer: User) -> tuple[Client, str]:
    workflow = routed_workflow(viewer, [priced_deployment(base_url="http://127.0.0.1:9/v1")])
    _, raw = api_token_create(user=viewer, name="validation")
    return Client(HTTP_X_API_KEY=raw), workflow.slug


def _post(client: tuple[Client, str], path: str, body: dict[str, Any]) -> Any:
    http, _ = client
    return http.post(path, json.dumps(body), content_type="application/json")


@pytest.mark.parametrize(("fields", "param"), MESSAGES, ids=[p for _, p in MESSAGES])
def test_a_malformed_message_body_is_a_400_naming_the_field(
    client: tuple[Client, str], fields: dict[str, Any], param: str
) -> None:
    body = {"model": client[1], "max_tokens": 8, "messages": [USER], **fields}
    answer = _post(client, "/v1/messages", body)
    assert answer.status_code == 400, answer.content
    doc = answer.json()
    assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
    assert doc["error"]["param"] == param, doc
    assert doc["error"]["message"].startswith(param.split("[")[0].split(".")[0]), doc  # in the API's terms
    assert not InferenceRequest.objects.exists()


@pytest.mark.parametrize(("fields", "param"), RESPONSES, ids=[p for _, p in RESPONSES])
def test_a_malformed_responses_body_is_a_400_naming_the_field(
    client: tuple[Client, str], fields: dict[str, Any], param: str
) -> None:
    body = {"model": client[1], "input": "hi", **fields}
    answer = _post(client, "/v1/responses", body)
    assert answer.status_code == 400, answer.content
    error = answer.json()["error"]
    assert error["param"] == param, error
    assert error["message"].startswith(param.split("[")[0].split(".")[0]), error  # in the API's terms
    assert not InferenceRequest.objects.exists()


def test_count_tokens_checks_the_fields_it_does_not_need(client: tuple[Client, str]) -> None:
    for fields, param in (({"stream": "junk"}, "stream"), ({"max_tokens": "junk"}, "max_tokens")):
        body = {"model": client[1], "messages": [USER], **fields}
        answer = _post(client, "/v1/messages/count_tokens", body)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.content


def test_errors_made_outside_the_view_leave_in_anthropics_shape_too(
    client: tuple[Client, str], settings: Any
) -> None:
    settings.V1_MAX_BODY_BYTES = 1000
    http, slug = client
    too_big = _post(
        client,
        "/v1/messages",
        {"model": slug, "max_tokens": 8, "messages": [{"role": "user", "content": "x" * 2000}]},
    )
    unknown = http.post("/v1/messages/batches", "{}", content_type="application/json")
    wrong_method = http.get("/v1/messages")
    for answer, status, kind in (
        (too_big, 413, "request_too_large"),
        (unknown, 404, "not_found_error"),
        (wrong_method, 405, "invalid_request_error"),
    ):
        assert answer.status_code == status
        doc = answer.json()
        assert doc["type"] == "error" and doc["error"]["type"] == kind, doc
    # Other /v1 paths keep OpenAI's shape.
    assert "type" not in http.post("/v1/nothing", "{}", content_type="application/json").json()


def _junk(rng: random.Random, depth: int = 0) -> Any:
    choices = [None, True, 0, -1, 1.5, "", "x", "user", "text", "function_call", "tool_use", [], {}]
    if depth < 3:
        choices += ["LIST", "DICT"]
    pick = rng.choice(choices)
    if pick == "LIST":
        return [_junk(rng, depth + 1) for _ in range(rng.randint(1, 3))]
    if pick == "DICT":
        keys = [
            "type",
            "role",
            "content",
            "text",
            "id",
            "name",
            "input",
            "source",
            "call_id",
            "arguments",
            "output",
        ]
        return {k: _junk(rng, depth + 1) for k in rng.sample(keys, rng.randint(1, 4))}
    return pick


FIELDS = {
    "/v1/messages": [
        "messages",
        "system",
        "tools",
        "tool_choice",
        "metadata",
        "stop_sequences",
        "output_config",
    ],
    "/v1/messages/count_tokens": ["messages", "system", "tools", "tool_choice"],
    "/v1/responses": ["input", "instructions", "tools", "tool_choice", "text", "reasoning", "metadata"],
}


@pytest.mark.parametrize("path", list(FIELDS))
def test_no_shape_of_json_makes_a_server_error(client: tuple[Client, str], path: str) -> None:
    """Random values in the fields the translator reads (a fixed seed: the same bodies each run).
    Most are refused; one that happens to be valid is answered (count_tokens) or routed to the
    workflow's deployment, which is down here (502): never an unhandled error."""
    rng = random.Random(20261206)
    statuses = set()
    for _ in range(300):
        body: dict[str, Any] = {"model": client[1]}
        if path == "/v1/messages":
            body["max_tokens"] = 8
        for name in rng.sample(FIELDS[path], rng.randint(1, 3)):
            body[name] = _junk(rng)
        answer = _post(client, path, body)
        assert answer.status_code in (200, 400, 502), (body, answer.content)
        if answer.status_code == 400:
            assert answer.json()["error"]["param"], (body, answer.content)
        statuses.add(answer.status_code)
    assert 400 in statuses
