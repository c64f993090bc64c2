"""The one interface every provider adapter implements, and the request/response types.

Adapters know nothing about the ORM: they get plain dataclasses and a deadline (and open their
connections through the outbound guard, registry.outbound.guard) and return
a Completion, or raise ProviderError with `retryable` set the way the router needs it
(connect errors, timeouts, 429 and 5xx are retryable; other 4xx are not) and the provider's
HTTP status, from which `client_error` (400, 413, 422: the request is at fault) follows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from registry.failover_codes import FailoverCode, failover_code_for_status


@dataclass(frozen=True)
class ChatMessage:
    """One turn, typed where Switchyard reads it.

    `content` is the turn's text (its text parts joined): what budget estimates, local models
    and Bedrock read. Tool turns keep `tool_calls` (an assistant's calls, as OpenAI shapes them)
    and `tool_call_id` (a `tool` turn's answer to one call); `parts` holds the content parts that
    are not text (images, audio, files) for adapters that map them. OpenAI-compatible providers
    get the message exactly as the client sent it (`ChatRequest.wire`).
    """

    role: str
    content: str
    tool_calls: tuple[dict[str, Any], ...] = ()
    tool_call_id: str | None = None
    parts: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class ChatRequest:
    """An OpenAI-style chat request; `model` is resolved by the router, not the caller.

    The typed fields are the ones Switchyard acts on (cost estimates, capability checks, the
    Bedrock mapping). `wire` is the client's body as checked by inference.gateway.openai_request, less
    `model`: OpenAI-compatible adapters send it unchanged (only `model` and the stream flags are
    set), so every field, known to Switchyard or not, reaches the provider as it was written.
    Requests built in-process (evals, batch lines of old, the bench) have no `wire`; the
    adapter builds the body from the typed fields and `extra`.
    """

    messages: tuple[ChatMessage, ...]
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    # Extra provider parameters passed through untouched (OpenAI-compatible only).
    extra: dict[str, Any] = field(default_factory=dict)
    wire: Mapping[str, Any] | None = None
    # The client's Anthropic Messages body (less `model` and `stream`) when it wrote one
    # (/v1/messages): an Anthropic-format provider gets it as written, cache_control and all;
    # every other adapter takes the chat request it was translated into.
    anthropic_wire: Mapping[str, Any] | None = None
    # The client's Responses body (less `model`; `previous_response_id` already made into
    # `input`) when it wrote one (/v1/responses, batch lines): a deployment that serves
    # `/responses` (Deployment.speaks_responses) gets it as written.
    responses_wire: Mapping[str, Any] | None = None

    @property
    def needs_json_schema(self) -> bool:
        return bool(self.response_format) and (self.response_format or {}).get("type") == "json_schema"

    @property
    def needs_vision(self) -> bool:
        return any(p.get("type") == "image_url" for m in self.messages for p in m.parts)


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    extra: dict[str, Any] = field(default_factory=dict)
    wire: Mapping[str, Any] | None = None  # as ChatRequest.wire


@dataclass(frozen=True)
class EmbeddingRequest:
    """An OpenAI-style embeddings request: `texts` are the inputs Switchyard reads (estimates);
    token-id inputs are carried in `wire` only. The answer is a Completion with `raw` the
    provider's embeddings document and `tokens_in` its prompt tokens."""

    texts: tuple[str, ...]
    wire: Mapping[str, Any] | None = None
    max_tokens: int | None = None  # nothing is generated: kept so every request type has one
    n: int = 1

    @property
    def prompt(self) -> str:
        return "".join(self.texts)


InferenceInput = ChatRequest | CompletionRequest  # requests that generate text


# A tool call whose arguments are not a JSON object (a model may write any text there, and a
# client sends it back as it was): OpenAI-compatible providers take it as written, Converse's
# toolUse.input must be an object. A capability of the adapter, not a flag a deployment declares
# (adapters/registry.ADAPTER_INHERENT); the name is what a refusal says it cannot serve.
TEXT_TOOL_ARGUMENTS = "tool call arguments that are not a JSON object"


def tool_arguments_object(text: str) -> dict[str, Any] | None:
    """A tool call's `arguments` as the JSON object they spell (empty: no arguments), or None."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


# Fields of a chat body that say who asks or how to account for the call, not what to answer: an
# adapter whose provider's format has no place for one leaves it out. Every other field it cannot
# carry is refused by name (unmapped_fields), never dropped: an answer that silently lacks what
# the caller asked for (a seed, a penalty, an effort) is wrong without saying so.
ACCOUNTING_FIELDS = frozenset(
    {
        "user",
        "metadata",
        "store",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
        "stream",
        "stream_options",
    }
)
# Values that ask for nothing: sent by SDKs and frameworks that fill in every default.
_NO_OP_VALUES: dict[str, Any] = {
    "n": 1,
    "best_of": 1,
    "top_logprobs": 0,
    "presence_penalty": 0,
    "frequency_penalty": 0,
}


def unmapped_fields(
    request: InferenceInput, carried: frozenset[str], *, parts: frozenset[str] = frozenset()
) -> list[str]:
    """The request's fields that an adapter carrying `carried` (and leaving ACCOUNTING_FIELDS
    out) cannot send: what it must refuse. A field set to null, false, an empty object or list,
    or a no-op default asks for nothing. Content parts other than text and the `parts` types the
    adapter maps are named by type."""
    out = sorted(
        name
        for name, value in (request.wire or {}).items()
        if name not in carried
        and name not in ACCOUNTING_FIELDS
        and value is not None
        and value is not False  # `is`: 0 == False, and a seed of 0 asks for something
        and not (isinstance(value, dict | list) and not value)
        and _NO_OP_VALUES.get(name, object()) != value
    )
    if request.n != 1 and "n" not in out:
        out.append("n")
    if isinstance(request, ChatRequest):
        kinds = {str(p.get("type")) for m in request.messages for p in m.parts} - parts
        if kinds:
            out.append(f"messages (content parts of type {', '.join(sorted(kinds))})")
    return out


def request_features(request: InferenceInput | EmbeddingRequest) -> frozenset[str]:
    """The capabilities a deployment needs to serve the request (Deployment.supports_*)."""
    if isinstance(request, EmbeddingRequest):
        return frozenset({"embeddings"})
    if not isinstance(request, ChatRequest):
        return frozenset()
    needed = set()
    if request.tools or any(m.tool_calls or m.role == "tool" for m in request.messages):
        needed.add("tools")
    if any(
        tool_arguments_object(str((call.get("function") or {}).get("arguments", ""))) is None
        for m in request.messages
        for call in m.tool_calls
    ):
        needed.add(TEXT_TOOL_ARGUMENTS)
    if request.needs_json_schema:
        needed.add("json_schema")
    if request.needs_vision:
        needed.add("vision")
    return frozenset(needed)


RoutedInput = InferenceInput | EmbeddingRequest  # everything the router serves


@dataclass
class Completion:
    """What a provider answered (non-streaming, or a finished stream).

    `text` is the first choice's text (what batch output and replays keep); `raw` is the
    provider's whole answer document when it speaks OpenAI's format, handed back to the caller
    with every field (tool calls, refusal, logprobs, system_fingerprint, usage details).
    `cached_tokens` is the part of `tokens_in` the provider read from its prompt cache,
    `cache_write_tokens` the part it wrote to it, and `reasoning_tokens` the part of `tokens_out`
    spent reasoning, as the provider reports them.
    """

    text: str
    tokens_in: int
    tokens_out: int
    finish_reason: str = "stop"
    provider_model: str = ""
    status_code: int = 200
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    raw: dict[str, Any] | None = None
    cache_write_tokens: int = 0  # of tokens_in, written to the provider's prompt cache


@dataclass(frozen=True)
class StreamChunk:
    """One piece of a streamed answer; the last chunk carries usage and finish_reason.

    `raw` is the provider's event document when it speaks OpenAI's format (the gateway passes
    it on: tool-call deltas, logprobs, several choices); `text` is choice 0's text in it.
    """

    text: str
    finish_reason: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    raw: dict[str, Any] | None = None
    cache_write_tokens: int = 0


def chat_chunk(
    *, ident: str, created: int, model: str, choices: list[dict[str, Any]], text: str = "", **fields: Any
) -> StreamChunk:
    """A StreamChunk carrying an OpenAI chat.completion.chunk event (`raw`, which the gateway
    passes on), for adapters that map another format's stream: `usage`, when given, goes into
    the event; the other `fields` are the chunk's own (finish_reason, token counts)."""
    raw: dict[str, Any] = {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if "usage" in fields:
        raw["usage"] = fields.pop("usage")
    return StreamChunk(text=text, raw=raw, **fields)


# "Your request is bad": the same request would be refused by any deployment, so the router
# stops at once, and the answer says nothing about the deployment's health (its breaker ignores it).
CLIENT_ERROR_STATUSES = frozenset({400, 413, 422})


class ProviderError(Exception):
    """A failed call; `retryable` says whether another try (here or elsewhere) may succeed, and
    `client_error` whether the request itself was refused (see CLIENT_ERROR_STATUSES).
    `retry_after` is the provider's own wait in seconds (a 429's Retry-After), when it said one.
    `code` is the failover code of the cause (registry.failover_codes): the adapter names
    it where it knows (a timeout, a broken connection, an unreadable answer), else it follows
    from the HTTP status. `refusal` is set on an adapter's own refusal before any call
    (adapter_refusal): what it cannot carry, in our words, which the caller is shown."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status_code: int | None = None,
        retry_after: float | None = None,
        code: FailoverCode | None = None,
        refusal: str = "",
    ) -> None:
        super().__init__(message)
        self.refusal = refusal
        self.status_code = status_code
        self.retry_after = retry_after
        self.client_error = status_code in CLIENT_ERROR_STATUSES
        self.retryable = retryable and not self.client_error
        self.code: str = code if code is not None else failover_code_for_status(status_code)


def adapter_refusal(target: Target, api: str, message: str) -> ProviderError:
    """A 400 an adapter raises before calling: the request asks for what `api` (the provider's
    wire format) cannot carry. `message` names the field; the caller sees it (never a provider's
    own words, which stay in the logs), the logs also the deployment."""
    return ProviderError(
        f"HTTP 400: {target.slug} ({api}): {message}",
        retryable=False,
        status_code=400,
        refusal=f"{api}: {message}",
    )


# An adapter's refusal as its attempt records it (str of adapter_refusal's error), so that a
# replayed request (inference.router.finish.replay) shows the caller the same words.
_REFUSAL_RECORDED = re.compile(r"HTTP 400: \S+ \((?P<api>[^)]*)\): (?P<message>.*)", re.DOTALL)


def refusal_recorded(error: str) -> str:
    """adapter_refusal's `refusal` from its recorded error ("" when `error` is not one)."""
    found = _REFUSAL_RECORDED.fullmatch(error)
    return f"{found['api']}: {found['message']}" if found else ""


def classify_status(status: int) -> bool:
    """Retryable? 408, 409 (conflict/lock), 429 and 5xx are; other 4xx are the caller's fault."""
    return status >= 500 or status in (408, 409, 429)


@dataclass(frozen=True)
class Target:
    """Where and how to call one deployment (a plain snapshot, safe to cache across requests)."""

    deployment_id: int
    slug: str
    kind: str  # adapter kind: openai-compatible, bedrock, anthropic
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

    def embed(self, target: Target, request: EmbeddingRequest, *, timeout: float) -> Completion: ...


def prompt_text(request: InferenceInput) -> str:
    """The request as one prompt string (for providers and local models that take text)."""
    if isinstance(request, CompletionRequest):
        return request.prompt
    return "\n".join(f"{m.role}: {m.content}" for m in request.messages) + "\nassistant:"
