"""Adapters against real loopback servers: OpenAI-compatible HTTP and Bedrock Converse."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import pytest

from bench.mockprovider import MockProviderServer
from inference.adapters.base import ChatMessage, ChatRequest, CompletionRequest, ProviderError, Target
from inference.adapters.bedrock import BedrockAdapter
from inference.adapters.chaos import ChaosAdapter
from inference.adapters.openai_compat import OpenAICompatibleAdapter
from tests.inference.converse_server import ConverseServer

CHAT = ChatRequest(messages=(ChatMessage("system", "be brief"), ChatMessage("user", "ping")), max_tokens=5)
COMPLETION = CompletionRequest(prompt="once upon", max_tokens=5, temperature=0.5)


def _target(base_url: str, kind: str = "openai-compatible", **extra: object) -> Target:
    return Target(
        deployment_id=1,
        slug="dep",
        kind=kind,
        base_url=base_url,
        provider_model_id="m-1",
        region="us-east-1",
        credentials="AKIDTEST:secret" if kind == "bedrock" else "sk-test",
        extra=dict(extra),
        allow_private=True,  # the mocks are on loopback, as an admin allowed for the provider
    )


def test_openai_chat_and_completion(mock_provider: Callable[..., MockProviderServer]) -> None:
    server = mock_provider(text="pong", tokens_in=9, tokens_out=2)
    adapter = OpenAICompatibleAdapter()
    chat = adapter.complete(_target(server.base_url), CHAT, timeout=5)
    assert (chat.text, chat.tokens_in, chat.tokens_out) == ("pong", 9, 2)
    assert server.behaviour.last_body["messages"][1] == {"role": "user", "content": "ping"}
    assert server.behaviour.last_body["max_tokens"] == 5
    done = adapter.complete(_target(server.base_url), COMPLETION, timeout=5)
    assert done.text == "pong"
    assert server.behaviour.last_body["prompt"] == "once upon"
    assert server.behaviour.calls == {"/v1/chat/completions": 1, "/v1/completions": 1}


def test_openai_keeps_the_connection_alive(mock_provider: Callable[..., MockProviderServer]) -> None:
    server = mock_provider()
    adapter = OpenAICompatibleAdapter()
    seen: set[int] = set()
    from inference.adapters import http_client

    for _ in range(5):
        adapter.complete(_target(server.base_url), CHAT, timeout=5)
        conn = http_client._connections()[("http", "127.0.0.1", server.server_address[1], True)]
        assert conn.sock is not None
        seen.add(conn.sock.getsockname()[1])
    assert len(seen) == 1  # one local port: one TCP connection for all five calls


def test_a_stream_left_part_read_does_not_spoil_the_next_call(
    mock_provider: Callable[..., MockProviderServer],
) -> None:
    """A caller that stops reading a stream (its client went away) leaves unread data on the
    kept-alive connection: the connection is dropped, and the thread's next call gets a fresh one
    instead of failing on the old answer's leftovers."""
    server = mock_provider(text="one two three four five six", tokens_in=4, tokens_out=6)
    adapter = OpenAICompatibleAdapter()
    chunks = adapter.stream(_target(server.base_url), CHAT, timeout=5)
    assert next(iter(chunks)).raw is not None
    chunks.close()  # type: ignore[attr-defined]  (a generator: what a WSGI server's close() does)
    assert (
        adapter.complete(_target(server.base_url), COMPLETION, timeout=5).text
        == "one two three four five six"
    )


def test_openai_streaming(mock_provider: Callable[..., MockProviderServer]) -> None:
    server = mock_provider(text="one two three", tokens_in=4, tokens_out=3)
    adapter = OpenAICompatibleAdapter()
    chunks = list(adapter.stream(_target(server.base_url), CHAT, timeout=5))
    assert "".join(c.text for c in chunks) == "one two three"
    assert (chunks[-1].tokens_in, chunks[-1].tokens_out, chunks[-1].finish_reason) == (4, 3, "stop")
    # The connection is reusable after a stream.
    assert adapter.complete(_target(server.base_url), COMPLETION, timeout=5).text == "one two three"


@pytest.mark.parametrize(
    ("status", "retryable"), [(503, True), (500, True), (429, True), (400, False), (401, False)]
)
def test_openai_errors_are_classified_and_their_body_is_logged_not_passed_on(
    mock_provider: Callable[..., MockProviderServer],
    status: int,
    retryable: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = mock_provider(status=status)
    with pytest.raises(ProviderError) as caught:
        OpenAICompatibleAdapter().complete(_target(server.base_url), CHAT, timeout=5)
    assert caught.value.status_code == status
    assert caught.value.retryable is retryable
    assert str(caught.value) == f"HTTP {status} from dep"
    assert f"mock failure {status}" in caplog.text


def test_openai_connect_error_timeout_and_malformed(mock_provider: Callable[..., MockProviderServer]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    adapter = OpenAICompatibleAdapter()
    with pytest.raises(ProviderError) as refused:
        adapter.complete(_target(f"http://127.0.0.1:{closed_port}/v1"), CHAT, timeout=2)
    assert refused.value.retryable and refused.value.status_code is None

    slow = mock_provider(delay_ms=500)
    with pytest.raises(ProviderError) as timed_out:
        adapter.complete(_target(slow.base_url), CHAT, timeout=0.1)
    assert timed_out.value.retryable and "timed out" in str(timed_out.value)

    broken = mock_provider(malformed=True)
    with pytest.raises(ProviderError) as malformed:
        adapter.complete(_target(broken.base_url), CHAT, timeout=2)
    assert malformed.value.retryable and "malformed" in str(malformed.value)


def test_chaos_injects_errors_without_calling(mock_provider: Callable[..., MockProviderServer]) -> None:
    server = mock_provider()
    chaos = ChaosAdapter(OpenAICompatibleAdapter())
    target = _target(server.base_url, chaos={"error_rate": 1.0, "status_codes": [502]})
    with pytest.raises(ProviderError) as caught:
        chaos.complete(target, CHAT, timeout=2)
    assert caught.value.status_code == 502 and caught.value.retryable
    assert server.behaviour.total_calls() == 0
    calm = _target(server.base_url, chaos={"error_rate": 0.0, "latency_ms": 1})
    assert chaos.complete(calm, CHAT, timeout=2).text == "pong"
    assert server.behaviour.total_calls() == 1
    bad = _target(server.base_url, chaos={"malformed_rate": 1.0})
    with pytest.raises(ProviderError, match="malformed"):
        chaos.complete(bad, CHAT, timeout=2)


@pytest.fixture
def converse() -> Iterator[ConverseServer]:
    server = ConverseServer()
    yield server
    server.stop()


def test_bedrock_converse(converse: ConverseServer) -> None:
    adapter = BedrockAdapter()
    done = adapter.complete(_target(converse.url, "bedrock"), CHAT, timeout=5)
    assert (done.text, done.tokens_in, done.tokens_out, done.finish_reason) == (
        "hello from bedrock",
        11,
        4,
        "stop",
    )
    path, body = converse.behaviour.requests[-1]
    assert path == "/model/m-1/converse"
    assert body["system"] == [{"text": "be brief"}]
    assert body["messages"] == [{"role": "user", "content": [{"text": "ping"}]}]
    assert body["inferenceConfig"] == {"maxTokens": 5}


def test_bedrock_converse_stream(converse: ConverseServer) -> None:
    chunks = list(BedrockAdapter().stream(_target(converse.url, "bedrock"), COMPLETION, timeout=5))
    assert "".join(c.text for c in chunks) == "hello from bedrock"
    assert (chunks[-1].tokens_in, chunks[-1].tokens_out) == (11, 4)
    assert converse.behaviour.requests[-1][0] == "/model/m-1/converse-stream"


@pytest.mark.parametrize(
    ("status", "error_type", "retryable"),
    [
        (429, "ThrottlingException", True),
        (503, "ServiceUnavailableException", True),
        (400, "ValidationException", False),
    ],
)
def test_bedrock_errors_are_classified(
    converse: ConverseServer, status: int, error_type: str, retryable: bool
) -> None:
    converse.behaviour.status = status
    converse.behaviour.error_type = error_type
    with pytest.raises(ProviderError) as caught:
        BedrockAdapter().complete(_target(converse.url, "bedrock"), CHAT, timeout=5)
    assert caught.value.status_code == status
    assert caught.value.retryable is retryable
    assert error_type in str(caught.value)
