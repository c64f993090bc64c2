"""An Anthropic-format provider (provider kind `anthropic`): the gateway calls its Messages API
natively, for /v1/chat/completions (OpenAI's SDK) and /v1/messages (Anthropic's SDK) alike.

The provider is a loopback Messages server (tests/inference/anthropic_server.py) that records the
path, headers and body it gets: each test checks the exact body sent upstream, what the SDK made of
the answer (plain and streamed), and the ledger (cache reads at the cached-input price).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import anthropic
import openai
import pytest
from django.contrib.auth.models import User

from billing.models import Unit, UsageRecord
from inference.adapters.anthropic import AnthropicAdapter
from inference.adapters.base import ChatMessage, ChatRequest, ProviderError, Target
from inference.models import InferenceRequest
from registry.failover_codes import FailoverCode
from registry.models import Deployment, FailoverEvent, Provider, Workflow
from registry.services import api_token_create, provider_set_credentials
from tests.factories import make_price, make_provider
from tests.helpers import ledger_settled
from tests.inference.anthropic_server import MessagesServer
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.inference.recording_provider import RecordingProvider

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "sk-ant-loopback-secret"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL_USE = {"type": "tool_use", "id": "toolu_paris", "name": "get_weather", "input": {"city": "Paris"}}


@pytest.fixture
def claude() -> Iterator[MessagesServer]:
    server = MessagesServer()
    yield server
    server.stop()


def _deployment(server: MessagesServer) -> Deployment:
    provider = make_provider(kind=Provider.Kind.ANTHROPIC, base_url=server.url)
    provider_set_credentials(provider=provider, credentials=SECRET)
    deployment = priced_deployment(provider=provider, provider_model_id="claude-test")
    make_price(unit=Unit.CACHED_INPUT_TOKENS_1M, unit_price=Decimal("0.25"), deployment=deployment)
    make_price(unit=Unit.CACHE_WRITE_TOKENS_1M, unit_price=Decimal("3.75"), deployment=deployment)
    return deployment


@pytest.fixture
def routed(live_server: Any, operator: User, claude: MessagesServer) -> tuple[str, Workflow, str]:
    """(the live server's URL, a workflow routed to the Anthropic deployment, a key)."""
    _, raw = api_token_create(user=operator, name="claude")
    return live_server.url, routed_workflow(operator, [_deployment(claude)]), raw


def _sent(claude: MessagesServer) -> dict[str, Any]:
    path, headers, body = claude.behaviour.requests[-1]
    assert path == "/v1/messages"
    assert headers["x-api-key"] == SECRET and headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in headers  # the caller's key never goes upstream
    return body


def _billed(row: InferenceRequest) -> dict[str, Decimal]:
    ledger_settled()
    return {
        r.unit: r.quantity
        for r in UsageRecord.objects.filter(subject_type="inference_request", subject_id=str(row.pk))
    }


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_chat_completions_reach_messages_natively_with_tools_and_cache_reads_and_writes_billed(
    routed: tuple[str, Workflow, str], claude: MessagesServer, stream: bool
) -> None:
    url, workflow, raw = routed
    claude.behaviour.blocks = [{"type": "text", "text": "Looking it up."}, TOOL_USE]
    claude.behaviour.stop_reason = "tool_use"
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=raw, max_retries=0)
    kwargs: dict[str, Any] = {
        "model": workflow.slug,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "max_tokens": 64,
        "temperature": 0.5,
        "stop": ["END"],
        "user": "end-user-7",
    }
    if stream:
        chunks = list(
            client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        calls = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
        call_id, name = calls[0].id, calls[0].function.name  # type: ignore[union-attr]
        arguments = "".join(d.function.arguments or "" for d in calls)  # type: ignore[union-attr]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        usage = chunks[-1].usage
    else:
        answer = client.chat.completions.create(**kwargs)
        message = answer.choices[0].message
        text = message.content or ""
        (call,) = message.tool_calls or []
        call_id, name, arguments = call.id, call.function.name, call.function.arguments  # type: ignore[union-attr]
        finish, usage = [answer.choices[0].finish_reason], answer.usage
    assert _sent(claude) == {
        "model": "claude-test",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}],
        "tools": [{"name": "get_weather", "input_schema": SCHEMA}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "temperature": 0.5,
        "stop_sequences": ["END"],
        "metadata": {"user_id": "end-user-7"},
        **({"stream": True} if stream else {}),
    }
    assert text == "Looking it up."
    assert (call_id, name, json.loads(arguments)) == ("toolu_paris", "get_weather", {"city": "Paris"})
    assert finish == ["tool_calls"]
    # input_tokens 9 + 20 read from the cache + 5 written to it
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (34, 4)
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 20
    row = InferenceRequest.objects.get()
    assert (row.tokens_in, row.tokens_out, row.stream) == (34, 4, stream)
    # Each part of the prompt in its own unit, at its own price: 9 uncached, 20 read, 5 written.
    assert _billed(row) == {
        Unit.INPUT_TOKENS_1M: Decimal("0.000009"),
        Unit.CACHED_INPUT_TOKENS_1M: Decimal("0.000020"),
        Unit.CACHE_WRITE_TOKENS_1M: Decimal("0.000005"),
        Unit.OUTPUT_TOKENS_1M: Decimal("0.000004"),
    }


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_messages_tool_round_trip_reaches_an_anthropic_provider_and_keeps_its_cache_counts(
    routed: tuple[str, Workflow, str], claude: MessagesServer, stream: bool
) -> None:
    url, workflow, raw = routed
    client = anthropic.Anthropic(base_url=url, api_key=raw, max_retries=0)
    tool = {"name": "get_weather", "description": "Current weather", "input_schema": SCHEMA}
    question = {"role": "user", "content": "Weather in Paris?"}

    def ask(**kwargs: Any) -> Any:
        if stream:
            with client.messages.stream(**kwargs) as events:
                return events.get_final_message()
        return client.messages.create(**kwargs)

    claude.behaviour.blocks, claude.behaviour.stop_reason = [TOOL_USE], "tool_use"
    first = ask(model=workflow.slug, max_tokens=128, messages=[question], tools=[tool])
    assert first.stop_reason == "tool_use"
    (use,) = first.content
    assert (use.type, use.id, use.name, use.input) == (
        "tool_use",
        "toolu_paris",
        "get_weather",
        {"city": "Paris"},
    )  # type: ignore[union-attr]

    claude.behaviour.blocks, claude.behaviour.stop_reason = (
        [{"type": "text", "text": "Sunny, 21 C."}],
        "end_turn",
    )
    # The second turn as Claude-based agents write it: a cached system prompt, the tool result.
    written: dict[str, Any] = {
        "max_tokens": 128,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "tools": [tool],
        "messages": [
            question,
            {"role": "assistant", "content": [TOOL_USE]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_paris", "content": "sunny, 21 C"}],
            },
        ],
        "metadata": {"user_id": "end-user-7"},
    }
    second = ask(model=workflow.slug, **written)
    # Sent natively, as written (cache_control and all), only the model being the deployment's.
    assert _sent(claude) == {**written, "model": "claude-test", **({"stream": True} if stream else {})}
    assert [b.text for b in second.content] == ["Sunny, 21 C."]  # type: ignore[union-attr]
    assert second.stop_reason == "end_turn"
    # What the provider counted comes back split as it was: uncached, read and written.
    assert (
        second.usage.input_tokens,
        second.usage.cache_read_input_tokens,
        second.usage.cache_creation_input_tokens,
        second.usage.output_tokens,
    ) == (9, 20, 5, 4)


def test_an_overloaded_anthropic_provider_fails_over_to_an_openai_compatible_one_with_the_chat_body(
    live_server: Any, operator: User, claude: MessagesServer, provider: RecordingProvider
) -> None:
    claude.behaviour.status, claude.behaviour.error_type = 529, "overloaded_error"
    fallback = priced_deployment(base_url=provider.base_url, provider_model_id="gpt-fallback")
    workflow = routed_workflow(operator, [_deployment(claude), fallback])
    _, raw = api_token_create(user=operator, name="claude-failover")
    client = anthropic.Anthropic(base_url=live_server.url, api_key=raw, max_retries=0)
    message = client.messages.create(
        model=workflow.slug,
        max_tokens=32,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": "hi"}],
    )
    assert len(claude.behaviour.requests) == 1  # tried first, natively
    assert message.content[0].text == "hello there"  # type: ignore[union-attr]
    sent = provider.script.last_body
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert sent["model"] == "gpt-fallback" and "cache_control" not in json.dumps(sent)
    ledger_settled()
    row = InferenceRequest.objects.get()
    assert [(a.outcome, a.status_code) for a in row.attempt_rows.order_by("position")] == [
        ("retryable", 529),
        ("ok", 200),
    ]


def test_what_messages_cannot_carry_goes_to_the_next_deployment_that_can(
    live_server: Any, operator: User, claude: MessagesServer, provider: RecordingProvider
) -> None:
    fallback = priced_deployment(base_url=provider.base_url, provider_model_id="gpt-fallback")
    workflow = routed_workflow(operator, [_deployment(claude), fallback])
    _, raw = api_token_create(user=operator, name="claude-skip")
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0)
    answer = client.chat.completions.create(
        model=workflow.slug, messages=[{"role": "user", "content": "hi"}], seed=7
    )
    assert answer.choices[0].message.content == "hello there"
    assert claude.behaviour.requests == [] and provider.script.last_body["seed"] == 7
    ledger_settled()
    row = InferenceRequest.objects.get()
    # Skipped as a deployment without a needed capability is: no breaker verdict, no failover.
    assert [(a.outcome, a.status_code) for a in row.attempt_rows.order_by("position")] == [
        ("unsupported", 400),
        ("ok", 200),
    ]
    assert not FailoverEvent.objects.exists()


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"seed": 7}, "seed"),
        ({"logprobs": True}, "logprobs"),
        ({"temperature": 1.5}, "temperature"),
        ({"reasoning_effort": "minimal"}, "reasoning_effort"),
        ({"n": 2}, "n"),
    ],
)
def test_what_messages_cannot_carry_is_refused_by_name_before_any_call(
    routed: tuple[str, Workflow, str], claude: MessagesServer, extra: dict[str, Any], named: str
) -> None:
    url, workflow, raw = routed
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=raw, max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=workflow.slug, messages=[{"role": "user", "content": "hi"}], extra_body=extra
        )
    assert named in str(caught.value)
    assert claude.behaviour.requests == []


def _target(server: MessagesServer) -> Target:
    return Target(
        deployment_id=1,
        slug="claude-loopback",
        kind="anthropic",
        base_url=server.url,
        provider_model_id="claude-test",
        credentials=SECRET,
        allow_private=True,
    )


CHAT = ChatRequest(messages=(ChatMessage(role="user", content="hi"),), max_tokens=16)


def test_an_overloaded_provider_is_retryable_and_a_refusal_is_not(claude: MessagesServer) -> None:
    adapter = AnthropicAdapter()
    claude.behaviour.status, claude.behaviour.error_type = 529, "overloaded_error"
    with pytest.raises(ProviderError) as overloaded:
        adapter.complete(_target(claude), CHAT, timeout=5)
    assert (overloaded.value.status_code, overloaded.value.retryable) == (529, True)
    claude.behaviour.status, claude.behaviour.error_type = 400, "invalid_request_error"
    with pytest.raises(ProviderError) as refused:
        adapter.complete(_target(claude), CHAT, timeout=5)
    assert (refused.value.client_error, refused.value.retryable) == (True, False)
    assert "mock failure" not in str(refused.value)  # the upstream body is logged, not passed on


def test_an_error_event_mid_stream_fails_the_call_with_its_status(claude: MessagesServer) -> None:
    claude.behaviour.stream_error = "overloaded_error"
    chunks = AnthropicAdapter().stream(_target(claude), CHAT, timeout=5)
    with pytest.raises(ProviderError) as failed:
        list(chunks)
    assert (failed.value.status_code, failed.value.retryable) == (529, True)


def test_a_stream_cut_before_the_message_ends_is_a_broken_connection(claude: MessagesServer) -> None:
    claude.behaviour.truncate = True  # the blocks, then nothing: no message_delta, no usage
    chunks = AnthropicAdapter().stream(_target(claude), CHAT, timeout=5)
    with pytest.raises(ProviderError) as failed:
        list(chunks)
    assert (failed.value.code, failed.value.retryable) == (FailoverCode.CONNECTION_ERROR, True)
    claude.behaviour.truncate = False
    whole = list(AnthropicAdapter().stream(_target(claude), CHAT, timeout=5))
    assert "".join(c.text for c in whole) == "hello from claude"
    assert (whole[-1].tokens_in, whole[-1].tokens_out, whole[-1].cached_tokens) == (34, 4, 20)


def test_an_hour_long_cache_write_is_refused_by_name_not_billed_at_the_five_minute_price(
    routed: tuple[str, Workflow, str], claude: MessagesServer
) -> None:
    url, workflow, raw = routed
    client = anthropic.Anthropic(base_url=url, api_key=raw, max_retries=0)
    long_cached = {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model=workflow.slug,
            max_tokens=16,
            system=[long_cached],
            messages=[{"role": "user", "content": "hi"}],
        )
    assert "cache_control.ttl" in str(caught.value)
    assert claude.behaviour.requests == []


def test_images_reach_an_anthropic_deployment_from_both_apis_and_audio_goes_elsewhere(
    live_server: Any, operator: User, claude: MessagesServer, provider: RecordingProvider
) -> None:
    claude_deployment = _deployment(claude)
    claude_deployment.supports_vision = True
    claude_deployment.save()
    fallback = priced_deployment(
        base_url=provider.base_url, provider_model_id="gpt-fallback", supports_vision=True
    )
    workflow = routed_workflow(operator, [claude_deployment, fallback])
    _, raw = api_token_create(user=operator, name="claude-vision")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    question = {"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]}
    client = anthropic.Anthropic(base_url=live_server.url, api_key=raw, max_retries=0)
    client.messages.create(model=workflow.slug, max_tokens=16, messages=[question])
    assert _sent(claude)["messages"] == [question]  # the image block as written

    # A chat request's image parts become image blocks ahead of the turn's text.
    chat = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0)
    png = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    web = {"type": "image_url", "image_url": {"url": "https://images.example/cat.jpg", "detail": "low"}}
    text = {"type": "text", "text": "What is this?"}
    chat.chat.completions.create(
        model=workflow.slug, messages=[{"role": "user", "content": [png, web, text]}]
    )
    assert _sent(claude)["messages"] == [
        {
            "role": "user",
            "content": [
                image,
                {"type": "image", "source": {"type": "url", "url": "https://images.example/cat.jpg"}},
                {"type": "text", "text": "What is this?"},
            ],
        }
    ]
    assert provider.script.calls() == 0

    # Audio has no Messages block: the adapter refuses it by name and the next deployment answers.
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    answer = chat.chat.completions.create(
        model=workflow.slug, messages=[{"role": "user", "content": [audio, text]}]
    )
    assert answer.choices[0].message.content == "hello there"
    assert len(claude.behaviour.requests) == 2 and provider.script.calls() == 1
