"""OpenAI-compatible providers over HTTP (OpenAI, vLLM, llama.cpp, our own serve_model).

The client's own body (`wire`) is sent with only `model` and the stream flags set, and the
answer document comes back whole. The HTTP client (kept-alive connections through the outbound
guard, error bodies logged, never passed on) is inference.adapters.http_client's.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

from inference.adapters.base import (
    ChatRequest,
    Completion,
    EmbeddingRequest,
    InferenceInput,
    ProviderError,
    StreamChunk,
    Target,
    classify_status,
)
from inference.adapters.http_client import (
    ConnKey,
    call_json,
    connection_drop,
    malformed_answer,
    open_stream,
    sse_chunks,
)
from inference.adapters.responses_mapping import (
    ResponseFailed,
    ResponsesStreamMapper,
    chat_from_response,
    responses_body,
)
from registry.failover_codes import FailoverCode


def _body(target: Target, request: InferenceInput, *, stream: bool) -> tuple[str, dict[str, Any]]:
    """The provider's request body: the client's own (`wire`) with only `model` and the stream
    flags set, or, for requests built in-process, one made from the typed fields.

    A stream always asks for usage (`stream_options.include_usage`): the ledger bills what the
    provider counted. The gateway drops the usage event again for a client that did not ask.
    """
    chat = isinstance(request, ChatRequest)
    path = "/chat/completions" if chat else "/completions"
    if request.wire is not None:
        body = dict(request.wire)
    else:
        body = {}
        if isinstance(request, ChatRequest):
            body["messages"] = [{"role": m.role, "content": m.content} for m in request.messages]
        else:
            body["prompt"] = request.prompt
        for name in ("max_tokens", "temperature", "top_p"):
            value = getattr(request, name)
            if value is not None:
                body[name] = value
        if request.stop:
            body["stop"] = list(request.stop)
        if request.n != 1:
            body["n"] = request.n
        body.update(request.extra)
    body["model"] = target.provider_model_id or target.slug
    if stream:
        body["stream"] = True
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    elif body.get("stream"):
        del body["stream"]
        body.pop("stream_options", None)
    return path, body


def _usage_counts(usage: dict[str, Any]) -> dict[str, int]:
    """Token counts of an OpenAI usage object, with the cached and reasoning details."""
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    return {
        "tokens_in": int(usage.get("prompt_tokens") or 0),
        "tokens_out": int(usage.get("completion_tokens") or 0),
        "cached_tokens": int(prompt_details.get("cached_tokens") or 0),
        # Not OpenAI's own field: providers that sell prompt caching (and routers in front of
        # Anthropic models) report cache writes here, as the translated Messages answers read it.
        "cache_write_tokens": int(prompt_details.get("cache_write_tokens") or 0),
        "reasoning_tokens": int(completion_details.get("reasoning_tokens") or 0),
    }


def _headers(target: Target) -> dict[str, str]:
    return {"Authorization": f"Bearer {target.credentials}"} if target.credentials else {}


def _text_of(choice: dict[str, Any], chat: bool) -> str:
    if chat:
        message = choice.get("message") or choice.get("delta") or {}
        return str(message.get("content") or "")
    return str(choice.get("text") or "")


class OpenAICompatibleAdapter:
    kind = "openai-compatible"

    def complete(self, target: Target, request: InferenceInput, *, timeout: float) -> Completion:
        wire = _native_responses(target, request)
        if wire is not None:
            return self._responses_complete(target, wire, timeout=timeout)
        path, body = _body(target, request, stream=False)
        resp, data = call_json(target, path, body, headers=_headers(target), timeout=timeout)
        try:
            doc = json.loads(data)
            choice = doc["choices"][0]
            if not isinstance(doc, dict) or not isinstance(choice, dict):
                raise TypeError("not an answer document")
            return Completion(
                text=_text_of(choice, isinstance(request, ChatRequest)),
                finish_reason=str(choice.get("finish_reason") or "stop"),
                provider_model=str(doc.get("model") or ""),
                status_code=resp.status,
                raw=doc,
                **_usage_counts(doc.get("usage") or {}),
            )
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise malformed_answer(target, resp.status, data) from exc

    def embed(self, target: Target, request: EmbeddingRequest, *, timeout: float) -> Completion:
        body: dict[str, Any] = (
            dict(request.wire) if request.wire is not None else {"input": list(request.texts)}
        )
        body["model"] = target.provider_model_id or target.slug
        resp, data = call_json(target, "/embeddings", body, headers=_headers(target), timeout=timeout)
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or not isinstance(doc["data"], list):
                raise TypeError("not an embeddings document")
            usage = doc.get("usage") or {}
            return Completion(
                text="",
                tokens_in=int(usage.get("prompt_tokens") or 0),
                tokens_out=0,
                provider_model=str(doc.get("model") or ""),
                status_code=resp.status,
                raw=doc,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise malformed_answer(target, resp.status, data, "embeddings answer") from exc

    def stream(self, target: Target, request: InferenceInput, *, timeout: float) -> Iterator[StreamChunk]:
        wire = _native_responses(target, request)
        if wire is not None:
            return self._responses_stream(target, wire, timeout=timeout)
        path, body = _body(target, request, stream=True)
        resp, key = open_stream(target, path, body, headers=_headers(target), timeout=timeout)
        return sse_chunks(target, resp, key, _ChatEvents(chat=isinstance(request, ChatRequest)))

    # A /v1/responses request to a deployment that serves `/responses`, sent as written
    # (inference.adapters.responses_mapping); its answer is read back into chat documents.

    def _responses_complete(self, target: Target, wire: dict[str, Any], *, timeout: float) -> Completion:
        body = responses_body(wire, model=target.provider_model_id or target.slug, stream=False)
        resp, data = call_json(target, "/responses", body, headers=_headers(target), timeout=timeout)
        try:
            doc = json.loads(data)
            if doc.get("status") == "failed":
                raise ResponseFailed(str((doc.get("error") or {}).get("code") or "server_error"))
            raw = chat_from_response(doc)
        except ResponseFailed as exc:
            raise _failed(target, exc) from exc
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise malformed_answer(target, resp.status, data) from exc
        choice = raw["choices"][0]
        return Completion(
            text=str(choice["message"]["content"] or ""),
            finish_reason=choice["finish_reason"],
            provider_model=str(doc.get("model") or ""),
            status_code=resp.status,
            raw=raw,
            **_usage_counts(raw["usage"]),
        )

    def _responses_stream(
        self, target: Target, wire: dict[str, Any], *, timeout: float
    ) -> Iterator[StreamChunk]:
        body = responses_body(wire, model=target.provider_model_id or target.slug, stream=True)
        resp, key = open_stream(target, "/responses", body, headers=_headers(target), timeout=timeout)
        return self._responses_events(
            target, resp, key, ResponsesStreamMapper(model=target.provider_model_id)
        )

    def _responses_events(
        self, target: Target, resp: http.client.HTTPResponse, key: ConnKey, mapper: ResponsesStreamMapper
    ) -> Iterator[StreamChunk]:
        def read(doc: dict[str, Any]) -> list[StreamChunk]:
            try:
                return mapper.event(doc)
            except ResponseFailed as exc:
                raise _failed(target, exc) from exc

        yield from sse_chunks(target, resp, key, read)
        if not mapper.finished:
            connection_drop(key)
            raise ProviderError(
                f"stream from {target.slug} ended before the response did",
                retryable=True,
                code=FailoverCode.CONNECTION_ERROR,
            )


def _native_responses(target: Target, request: InferenceInput) -> dict[str, Any] | None:
    """The caller's Responses body when it wrote one and the deployment serves `/responses`."""
    if (
        isinstance(request, ChatRequest)
        and request.responses_wire is not None
        and target.extra.get("responses_api")
    ):
        return dict(request.responses_wire)
    return None


def _failed(target: Target, exc: ResponseFailed) -> ProviderError:
    """A Response that failed, or an `error` event, with the status its code means."""
    caller_side = exc.code.startswith(("invalid", "image_", "unsupported_", "empty_", "failed_to_download"))
    status = 429 if exc.code == "rate_limit_exceeded" else 400 if caller_side else 500
    return ProviderError(
        f"HTTP {status} {exc.code[:64]} from {target.slug} (the response failed)",
        retryable=classify_status(status),
        status_code=status,
    )


class _ChatEvents:
    """OpenAI chat (or completions) stream events as chunks, one per event, the event itself in
    `raw` (the gateway passes it on whole); the usage event ends the answer."""

    def __init__(self, *, chat: bool) -> None:
        self.chat = chat
        self.finish: str | None = None

    def __call__(self, doc: dict[str, Any]) -> list[StreamChunk]:
        text, finish_now = "", None
        for choice in doc.get("choices") or []:
            if not isinstance(choice, dict):
                raise TypeError("a choice is not an object")
            if choice.get("index", 0) == 0:
                text = _text_of(choice, self.chat)
                finish_now = choice.get("finish_reason") or None
            self.finish = choice.get("finish_reason") or self.finish
        usage = doc.get("usage")
        if isinstance(usage, dict) and usage:
            return [
                StreamChunk(text=text, finish_reason=self.finish or "stop", raw=doc, **_usage_counts(usage))
            ]
        return [StreamChunk(text=text, finish_reason=finish_now, raw=doc)]
