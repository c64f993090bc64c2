"""Anthropic-format providers (Anthropic's API, and servers that speak its Messages API) over HTTP.

A request the caller wrote in Messages (/v1/messages) is sent as written, `model` replaced; a chat
request as the Messages body it maps to (inference.adapters.anthropic_mapping: tools, tool
choice, JSON mode as a forced tool); both to `<base URL>/v1/messages` (the base URL is the host, as in
Anthropic's SDK: https://api.anthropic.com), with the provider's secret as `x-api-key` and
`anthropic-version`; the answer, plain or streamed, comes back as OpenAI documents, so the
gateway passes it on as it does an OpenAI-compatible provider's, and /v1/messages gets it back
in Anthropic's shape. What the mapping cannot carry is a 400 before any call, naming the field.

The HTTP client is inference.adapters.http_client: one
kept-alive connection per thread and host, opened through the outbound guard; an upstream error
body is logged there, never passed on. Anthropic's 529 (overloaded) is retryable like any 5xx.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

from django.conf import settings

from inference.adapters.anthropic_mapping import (
    API_VERSION,
    CARRIED_FIELDS,
    MessagesStreamMapper,
    StreamFailed,
    chat_from_message,
    messages_body,
)
from inference.adapters.base import (
    ChatRequest,
    Completion,
    EmbeddingRequest,
    InferenceInput,
    ProviderError,
    StreamChunk,
    Target,
    adapter_refusal,
    classify_status,
    unmapped_fields,
)
from inference.adapters.converse_mapping import ConversePlan, Unmappable
from inference.adapters.http_client import (
    ConnKey,
    call_json,
    connection_drop,
    malformed_answer,
    open_stream,
    sse_chunks,
)
from registry.failover_codes import FailoverCode

# An `error` event's type in a stream -> the HTTP status the same error has as an answer.
_STREAM_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
}


def _refusal(target: Target, message: str) -> ProviderError:
    return adapter_refusal(target, "Anthropic Messages", message)


def _unsupported(request: InferenceInput) -> list[str]:
    """What the Messages mapping cannot carry: refused, never dropped."""
    if not isinstance(request, ChatRequest):
        return ["prompt (Anthropic's Messages API has no text completions)"]
    return unmapped_fields(request, CARRIED_FIELDS, parts=frozenset({"image_url"}))


def _request(target: Target, request: InferenceInput, *, stream: bool) -> tuple[dict[str, Any], ConversePlan]:
    model = target.provider_model_id or target.slug
    if isinstance(request, ChatRequest) and request.anthropic_wire is not None:
        # The caller wrote Messages (/v1/messages, checked there): sent as written.
        if _long_cache_writes(request.anthropic_wire):
            raise _refusal(
                target,
                "does not take cache_control.ttl other than 5m: hour-long cache writes are billed at "
                "another price than the one cache-write price the ledger keeps",
            )
        body = {**request.anthropic_wire, "model": model}
        if stream:
            body["stream"] = True
        return body, ConversePlan(args={})
    unsupported = _unsupported(request)
    if unsupported:
        raise _refusal(target, f"does not take {', '.join(unsupported)}")
    assert isinstance(request, ChatRequest)  # noqa: S101 (_unsupported refused the others)
    try:
        body, plan = messages_body(
            request,
            model=model,
            default_max_tokens=int(settings.INFERENCE_MAX_OUTPUT_TOKENS),
        )
    except Unmappable as exc:
        raise _refusal(target, str(exc)) from exc
    if stream:
        body["stream"] = True
    return body, plan


def _long_cache_writes(value: Any) -> bool:
    """Whether a Messages body asks for a cache write kept longer than the default 5 minutes
    (a `cache_control` with another `ttl`, anywhere: top level, system, tools, blocks)."""
    if isinstance(value, dict):
        control = value.get("cache_control")
        if isinstance(control, dict) and control.get("ttl", "5m") != "5m":
            return True
        return any(_long_cache_writes(v) for v in value.values())
    if isinstance(value, list):
        return any(_long_cache_writes(v) for v in value)
    return False


def _headers(target: Target) -> dict[str, str]:
    headers = {"anthropic-version": API_VERSION}
    if target.credentials:
        headers["x-api-key"] = target.credentials
    return headers


class AnthropicAdapter:
    kind = "anthropic"

    def complete(self, target: Target, request: InferenceInput, *, timeout: float) -> Completion:
        body, plan = _request(target, request, stream=False)
        resp, data = call_json(target, "/v1/messages", body, headers=_headers(target), timeout=timeout)
        try:
            doc = json.loads(data)
            text, finish, raw, usage = chat_from_message(doc, plan, model=target.provider_model_id)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise malformed_answer(target, resp.status, data, "Messages answer") from exc
        return Completion(
            text=text,
            tokens_in=usage.prompt,
            tokens_out=usage.output,
            cached_tokens=usage.cache_read,
            cache_write_tokens=usage.cache_write,
            finish_reason=finish,
            provider_model=str(doc.get("model") or target.provider_model_id),
            status_code=resp.status,
            raw=raw,
        )

    def embed(self, target: Target, request: EmbeddingRequest, *, timeout: float) -> Completion:
        raise ProviderError(f"{target.slug}: Anthropic's API serves no embeddings", retryable=False)

    def stream(self, target: Target, request: InferenceInput, *, timeout: float) -> Iterator[StreamChunk]:
        body, plan = _request(target, request, stream=True)
        resp, key = open_stream(target, "/v1/messages", body, headers=_headers(target), timeout=timeout)
        return self._events(target, resp, key, MessagesStreamMapper(plan, model=target.provider_model_id))

    def _events(
        self, target: Target, resp: http.client.HTTPResponse, key: ConnKey, mapper: MessagesStreamMapper
    ) -> Iterator[StreamChunk]:
        def read(doc: dict[str, Any]) -> list[StreamChunk]:
            try:
                return mapper.event(doc)
            except StreamFailed as exc:  # an `error` event: the status its type has as an answer
                status = _STREAM_ERROR_STATUS.get(exc.kind, 500)
                raise ProviderError(
                    f"HTTP {status} {exc.kind[:64]} from {target.slug} (in the stream)",
                    retryable=classify_status(status),
                    status_code=status,
                ) from exc

        yield from sse_chunks(target, resp, key, read)
        if not mapper.finished:
            connection_drop(key)
            raise ProviderError(
                f"stream from {target.slug} ended before the message did",
                retryable=True,
                code=FailoverCode.CONNECTION_ERROR,
            )
