"""Amazon Bedrock through boto3's bedrock-runtime Converse / ConverseStream APIs.

Chat requests, tools and JSON mode included, are mapped to Converse and their answers back to
OpenAI documents and chunk events by inference.adapters.converse_mapping (the mapping and its
sources are described there); what Converse cannot take (images, logprobs, n > 1) is refused
with a 400 before any call.

botocore's own retries are off (the router decides about retries and fallbacks, within the
request's deadline). Credentials are the provider's secret as "ACCESS_KEY:SECRET_KEY"; an
empty secret uses boto3's default chain. The deployment's (or provider's) base_url, when set,
is the endpoint URL (a VPC endpoint, or the loopback server the tests run); every request the
client sends is checked by the outbound guard (registry.outbound.guard) first, and what the
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
    adapter_refusal,
    classify_status,
    unmapped_fields,
)
from inference.adapters.converse_mapping import (
    CONVERSE_FIELDS,
    FINISH,
    ConversePlan,
    ConverseStreamMapper,
    Unmappable,
    chat_answer,
    converse_request,
)
from registry.failover_codes import FailoverCode
from registry.outbound.guard import PRIVATE_ALLOWED, PUBLIC_ONLY, OutboundRefused, botocore_guard

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
    """What this adapter cannot map to Converse: refused (HTTP 400 from the adapter), never
    dropped (base.unmapped_fields). Tools and JSON mode are mapped; images are not."""
    return unmapped_fields(request, CONVERSE_FIELDS)


def _refusal(target: Target, message: str) -> ProviderError:
    return adapter_refusal(target, "Bedrock Converse", message)


def _converse_plan(target: Target, request: InferenceInput) -> ConversePlan:
    unsupported = unsupported_features(request)
    if unsupported:
        raise _refusal(target, f"does not take {', '.join(unsupported)}")
    model_id = target.provider_model_id or target.slug
    if isinstance(request, ChatRequest):
        try:
            plan = converse_request(request, model_id=model_id)
        except Unmappable as exc:
            raise _refusal(target, str(exc)) from exc
    else:
        plan = ConversePlan(
            args={"modelId": model_id, "messages": [{"role": "user", "content": [{"text": request.prompt}]}]}
        )
    config: dict[str, Any] = {}
    if request.max_tokens is not None:
        config["maxTokens"] = request.max_tokens
    if request.temperature is not None:
        config["temperature"] = request.temperature
    if request.top_p is not None:
        config["topP"] = request.top_p
    if request.stop:
        config["stopSequences"] = list(request.stop)
    if config:
        plan.args["inferenceConfig"] = config
    return plan


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
        ParamValidationError,
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
    if isinstance(exc, ParamValidationError):
        # botocore checked the request against the Converse model before sending it (an empty
        # tool call id, say): the request is at fault, not the deployment.
        return ProviderError(
            f"HTTP 400: {slug} (Bedrock Converse): {exc}"[:1000], retryable=False, status_code=400
        )
    if isinstance(exc, OutboundRefused):
        return ProviderError(f"{slug}: {exc}", retryable=False, code=FailoverCode.ENDPOINT_REFUSED)
    if isinstance(exc, ReadTimeoutError):
        return ProviderError(f"{slug}: timed out", retryable=True, code=FailoverCode.TIMEOUT)
    if isinstance(exc, BotoConnectionError | OSError):
        return ProviderError(
            f"{slug}: cannot connect: {exc}", retryable=True, code=FailoverCode.CONNECTION_ERROR
        )
    logger.warning("bedrock %s failed: %s", slug, exc)
    return ProviderError(f"{slug}: {type(exc).__name__}", retryable=True)


class BedrockAdapter:
    kind = "bedrock"

    def complete(self, target: Target, request: InferenceInput, *, timeout: float) -> Completion:
        from botocore.exceptions import BotoCoreError, ClientError

        plan = _converse_plan(target, request)
        try:
            doc = _client(target, timeout).converse(**plan.args)
        except (ClientError, BotoCoreError, OutboundRefused, OSError) as exc:
            raise _map_error(exc, target.slug) from exc
        try:
            usage = doc.get("usage") or {}
            tokens_in, tokens_out = int(usage.get("inputTokens") or 0), int(usage.get("outputTokens") or 0)
            if isinstance(request, ChatRequest):
                # An OpenAI answer document (tool calls, JSON mode): the gateway passes it on.
                text, finish, raw = chat_answer(doc, plan, model=target.provider_model_id)
                return Completion(
                    text=text,
                    tokens_in=tokens_in,
                    tokens_out=tokens_out,
                    finish_reason=finish,
                    provider_model=target.provider_model_id,
                    raw=raw,
                )
            blocks = doc["output"]["message"]["content"]
            return Completion(
                text="".join(str(b.get("text", "")) for b in blocks),
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                finish_reason=FINISH.get(str(doc.get("stopReason")), "stop"),
                provider_model=target.provider_model_id,
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ProviderError(
                f"malformed Converse answer from {target.slug}",
                retryable=True,
                code=FailoverCode.MALFORMED_RESPONSE,
            ) from exc

    def embed(self, target: Target, request: EmbeddingRequest, *, timeout: float) -> Completion:
        # Bedrock's embedding models answer InvokeModel in per-model formats, not Converse.
        raise ProviderError(f"{target.slug}: the Bedrock adapter serves no embeddings", retryable=False)

    def stream(self, target: Target, request: InferenceInput, *, timeout: float) -> Iterator[StreamChunk]:
        from botocore.exceptions import BotoCoreError, ClientError

        plan = _converse_plan(target, request)
        try:
            resp = _client(target, timeout).converse_stream(**plan.args)
        except (ClientError, BotoCoreError, OutboundRefused, OSError) as exc:
            raise _map_error(exc, target.slug) from exc
        if isinstance(request, ChatRequest):
            return self._chat_events(
                target, resp["stream"], ConverseStreamMapper(plan, model=target.provider_model_id)
            )
        return self._events(target, resp["stream"])

    def _chat_events(
        self, target: Target, events: Any, mapper: ConverseStreamMapper
    ) -> Iterator[StreamChunk]:
        """OpenAI chunk events (in `raw`, passed on by the gateway): text, tool calls, usage."""
        from botocore.exceptions import BotoCoreError, ClientError, EventStreamError

        try:
            for event in events:
                try:
                    chunk = mapper.event(event)
                except (KeyError, TypeError, AttributeError, ValueError) as exc:
                    raise ProviderError(
                        f"malformed ConverseStream event from {target.slug}",
                        retryable=True,
                        code=FailoverCode.MALFORMED_RESPONSE,
                    ) from exc
                if chunk is not None:
                    yield chunk
        except (ClientError, EventStreamError, BotoCoreError) as exc:
            raise _map_error(exc, target.slug) from exc

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
                    finish = FINISH.get(str(event["messageStop"].get("stopReason")), "stop")
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
