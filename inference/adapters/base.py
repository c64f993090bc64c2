"""The one interface every provider adapter implements, and the request/response types.

Adapters know nothing about the ORM: they get plain dataclasses and a deadline (and open their
connections through the outbound guard, stack.registry.outbound) and return
a Completion, or raise ProviderError with `retryable` set the way the router needs it
(connect errors, timeouts, 429 and 5xx are retryable; other 4xx are not) and the provider's
HTTP status, from which `client_error` (400, 413, 422: the request is at fault) follows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True)
class ChatRequest:
    """An OpenAI-style chat request; `model` is resolved by the router, not the caller."""

    messages: tuple[ChatMessage, ...]
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    # Extra provider parameters passed through untouched (OpenAI-compatible only).
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


InferenceInput = ChatRequest | CompletionRequest


@dataclass
class Completion:
    """What a provider answered (non-streaming, or a finished stream)."""

    text: str
    tokens_in: int
    tokens_out: int
    finish_reason: str = "stop"
    provider_model: str = ""
    status_code: int = 200


@dataclass(frozen=True)
class StreamChunk:
    """One piece of a streamed answer; the last chunk carries usage and finish_reason."""

    text: str
    finish_reason: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None


# "Your request is bad": the same request would be refused by any deployment, so the router
# stops at once, and the answer says nothing about the deployment's health (its breaker ignores it).
CLIENT_ERROR_STATUSES = frozenset({400, 413, 422})


class ProviderError(Exception):
    """A failed call; `retryable` says whether another try (here or elsewhere) may succeed, and
    `client_error` whether the request itself was refused (see CLIENT_ERROR_STATUSES)."""

    def __init__(self, message: str, *, retryable: bool, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.client_error = status_code in CLIENT_ERROR_STATUSES
        self.retryable = retryable and not self.client_error


def classify_status(status: int) -> bool:
    """Retryable? 408, 409 (conflict/lock), 429 and 5xx are; other 4xx are the caller's fault."""
    return status >= 500 or status in (408, 409, 429)


@dataclass(frozen=True)
class Target:
    """Where and how to call one deployment (a plain snapshot, safe to cache across requests)."""

    deployment_id: int
    slug: str
    kind: str  # adapter kind: openai-compatible, bedrock
    base_url: str
    provider_model_id: str
    region: str = ""
    credentials: str = ""  # decrypted secret (API key, or AWS "access:secret")
    extra: dict[str, Any] = field(default_factory=dict)
    # The provider's admin-set allow_private_network (the outbound guard's policy).
    allow_private: bool = False
    # Why this deployment may not be called (its base URL is outside the provider's endpoints):
    # the adapter registry refuses it before any connection is made.
    refused: str = ""


class Adapter(Protocol):
    def complete(self, target: Target, request: InferenceInput, *, timeout: float) -> Completion: ...

    def stream(self, target: Target, request: InferenceInput, *, timeout: float) -> Iterator[StreamChunk]: ...


def prompt_text(request: InferenceInput) -> str:
    """The request as one prompt string (for providers and local models that take text)."""
    if isinstance(request, CompletionRequest):
        return request.prompt
    return "\n".join(f"{m.role}: {m.content}" for m in request.messages) + "\nassistant:"
