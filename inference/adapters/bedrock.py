"""Amazon Bedrock through boto3's bedrock-runtime Converse / ConverseStream APIs.

botocore's own retries are off (the router decides about retries and fallbacks, within the
request's deadline). Credentials are the provider's secret as "ACCESS_KEY:SECRET_KEY"; an
empty secret uses boto3's default chain. The deployment's (or provider's) base_url, when set,
is the endpoint URL (a VPC endpoint, or the loopback server the tests run); every request the
client sends is checked by the outbound guard (stack.registry.outbound) first, and what the
endpoint answers in an error is logged, never passed on.

boto3 and botocore are imported inside the functions that call Bedrock: they take a noticeable
time to import, and most processes never call Bedrock.
"""

from __future__ import annotations

import logging
import threading
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
from stack.registry.outbound import PRIVATE_ALLOWED, PUBLIC_ONLY, OutboundRefused, botocore_guard

logger = logging.getLogger(__name__)
_clients: dict[tuple[str, str, str, float, bool], Any] = {}
_lock = threading.Lock()


def _client(target: Target, timeout: float) -> Any:
    # Timeouts are part of a botocore client's config: keep one client per rounded deadline.
    rounded = max(0.5, round(timeout, 1))
    key = (target.base_url, target.region, target.credentials, rounded, target.allow_private)
    client = _clients.get(key)
    if client is not None:
        return client
    import boto3
    from botocore.config import Config

    access, _, secret = target.credentials.partition(":")
    kwargs: dict[str, Any] = {
        "region_name": target.region or "us-east-1",
        "config": Config(
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=rounded,
            read_timeout=rounded,
            max_pool_connections=32,
        ),
    }
    if target.base_url:
        kwargs["endpoint_url"] = target.base_url
    if access and secret:
        kwargs["aws_access_key_id"] = access
        kwargs["aws_secret_access_key"] = secret
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = boto3.session.Session().client("bedrock-runtime", **kwargs)
            # Every request this client sends is checked by the outbound guard first.
            policy = PRIVATE_ALLOWED if target.allow_private else PUBLIC_ONLY
            client.meta.events.register("before-send", botocore_guard(policy))
            _clients[key] = client
    return client


def unsupported_features(request: InferenceInput) -> list[str]:
    """What this adapter cannot map to Converse yet: refused (HTTP 400 from the adapter), never
    dropped, since an answer without the tool call or the schema the caller asked for is wrong
    without saying so."""
    wire = request.wire or {}
    out = [name for name in ("logprobs", "top_logprobs", "logit_bias") if wire.get(name)]
    if request.n != 1:
        out.append("n")
    if isinstance(request, ChatRequest):
        if request.tools or request.tool_choice is not None:
            out.append("tools")
        if request.response_format and request.response_format.get("type") != "text":
            out.append("response_format")
        if any(m.parts or m.tool_calls or m.role == "tool" for m in request.messages):
            out.append("messages (content parts or tool turns)")
    return out


def _converse_args(target: Target, request: InferenceInput) -> dict[str, Any]:
    unsupported = unsupported_features(request)
    if unsupported:
        raise ProviderError(
            f"HTTP 400: {target.slug} (Bedrock Converse) does not take {', '.join(unsupported)}",
            retryable=False,
            status_code=400,
        )
    system: list[dict[str, str]] = []
    messages: list[dict[str, Any]] = []
    if isinstance(request, ChatRequest):
        for m in request.messages:
            if m.role == "system":
                system.append({"text": m.content})
            else:
                role = "assistant" if m.role == "assistant" else "user"
                messages.append({"role": role, "content": [{"text": m.content}]})
    else:
        messages.append({"role": "user", "content": [{"text": request.prompt}]})
    config: dict[str, Any] = {}
    if request.max_tokens is not None:
        config["maxTokens"] = request.max_tokens
    if request.temperature is not None:
        config["temperature"] = request.temperature
    if request.top_p is not None:
        config["topP"] = request.top_p
    if request.stop:
        config["stopSequences"] = list(request.stop)
    args: dict[str, Any] = {"modelId": target.provider_model_id or target.slug, "messages": messages}
    if system:
        args["system"] = system
    if config:
        args["inferenceConfig"] = config
    return args


_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length"}
_STATUS_BY_CODE = {
    "ValidationException": 400,
    "ThrottlingException": 429,
    "ModelTimeoutException": 408,
    "ServiceUnavailableException": 503,
}


def _map_error(exc: Exception, slug: str) -> ProviderError:
    from botocore.exceptions import (
        ClientError,
        EventStreamError,
        ReadTimeoutError,
    )
    from botocore.exceptions import (
        ConnectionError as BotoConnectionError,
    )

    if isinstance(exc, ClientError | EventStreamError):
        meta = exc.response.get("ResponseMetadata", {})
        status = int(meta.get("HTTPStatusCode") or 0)
        code = exc.response.get("Error", {}).get("Code", "")
        if not status:
            # An error event inside a stream carries no HTTP status: take it from the code, so a
            # refused request (ValidationException) stays a client error, not a 500.
            status = _STATUS_BY_CODE.get(code, 500)
        # What AWS (or whatever answers at the endpoint) said is logged, not passed on.
        logger.warning(
            "bedrock %s answered HTTP %s %s: %s", slug, status, code, exc.response.get("Error", {})
        )
        return ProviderError(
            f"HTTP {status} {code[:64]} from {slug}", retryable=classify_status(status), status_code=status
        )
    if isinstance(exc, OutboundRefused):
        return ProviderError(f"{slug}: {exc}", retryable=False)
    if isinstance(exc, ReadTimeoutError):
        return ProviderError(f"{slug}: timed out", retryable=True)
    if isinstance(exc, BotoConnectionError | OSError):
        return ProviderError(f"{slug}: cannot connect: {exc}", retryable=True)
    logger.warning("bedrock %s failed: %s", slug, exc)
    return ProviderError(f"{slug}: {type(exc).__name__}", retryable=True)


class BedrockAdapter:
    kind = "bedrock"

    def complete(self, target: Target, request: InferenceInput, *, timeout: float) -> Completion:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            doc = _client(target, timeout).converse(**_converse_args(target, request))
        except (ClientError, BotoCoreError, OutboundRefused, OSError) as exc:
            raise _map_error(exc, target.slug) from exc
        try:
            blocks = doc["output"]["message"]["content"]
            usage = doc.get("usage") or {}
            return Completion(
                text="".join(str(b.get("text", "")) for b in blocks),
                tokens_in=int(usage.get("inputTokens") or 0),
                tokens_out=int(usage.get("outputTokens") or 0),
                finish_reason=_FINISH.get(str(doc.get("stopReason")), "stop"),
                provider_model=target.provider_model_id,
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ProviderError(f"malformed Converse answer from {target.slug}", retryable=True) from exc

    def embed(self, target: Target, request: EmbeddingRequest, *, timeout: float) -> Completion:
        # Bedrock's embedding models answer InvokeModel in per-model formats, not Converse.
        raise ProviderError(f"{target.slug}: the Bedrock adapter serves no embeddings", retryable=False)

    def stream(self, target: Target, request: InferenceInput, *, timeout: float) -> Iterator[StreamChunk]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            resp = _client(target, timeout).converse_stream(**_converse_args(target, request))
        except (ClientError, BotoCoreError, OutboundRefused, OSError) as exc:
            raise _map_error(exc, target.slug) from exc
        return self._events(target, resp["stream"])

    def _events(self, target: Target, events: Any) -> Iterator[StreamChunk]:
        from botocore.exceptions import BotoCoreError, ClientError, EventStreamError

        finish = "stop"
        try:
            for event in events:
                if "contentBlockDelta" in event:
                    text = event["contentBlockDelta"].get("delta", {}).get("text", "")
                    if text:
                        yield StreamChunk(text=text)
                elif "messageStop" in event:
                    finish = _FINISH.get(str(event["messageStop"].get("stopReason")), "stop")
                elif "metadata" in event:
                    usage = event["metadata"].get("usage") or {}
                    yield StreamChunk(
                        text="",
                        finish_reason=finish,
                        tokens_in=int(usage.get("inputTokens") or 0),
                        tokens_out=int(usage.get("outputTokens") or 0),
                    )
        except (ClientError, EventStreamError, BotoCoreError) as exc:
            raise _map_error(exc, target.slug) from exc
