"""Which adapter serves which provider kind."""

from __future__ import annotations

from collections.abc import Iterator

from inference.adapters.anthropic import AnthropicAdapter
from inference.adapters.base import (
    TEXT_TOOL_ARGUMENTS,
    Adapter,
    Completion,
    EmbeddingRequest,
    InferenceInput,
    ProviderError,
    StreamChunk,
    Target,
)
from inference.adapters.bedrock import BedrockAdapter
from inference.adapters.chaos import ChaosAdapter
from inference.adapters.openai_compat import OpenAICompatibleAdapter
from registry.failover_codes import FailoverCode

_openai = OpenAICompatibleAdapter()
_bedrock = BedrockAdapter()
_ADAPTERS: dict[str, Adapter] = {
    "openai-compatible": _openai,
    "bedrock": _bedrock,
    "anthropic": AnthropicAdapter(),
}
_CHAOS: dict[str, Adapter] = {kind: ChaosAdapter(inner) for kind, inner in _ADAPTERS.items()}


class RefusedAdapter:
    """A deployment whose base URL lies outside its provider's endpoints: never called."""

    kind = "refused"

    def complete(self, target: Target, request: InferenceInput, *, timeout: float) -> Completion:
        raise ProviderError(
            f"{target.slug}: {target.refused}", retryable=False, code=FailoverCode.ENDPOINT_REFUSED
        )

    def stream(self, target: Target, request: InferenceInput, *, timeout: float) -> Iterator[StreamChunk]:
        raise ProviderError(
            f"{target.slug}: {target.refused}", retryable=False, code=FailoverCode.ENDPOINT_REFUSED
        )

    def embed(self, target: Target, request: EmbeddingRequest, *, timeout: float) -> Completion:
        raise ProviderError(
            f"{target.slug}: {target.refused}", retryable=False, code=FailoverCode.ENDPOINT_REFUSED
        )


_refused = RefusedAdapter()


# What each adapter maps today; a deployment's declared capabilities are limited to these.
ADAPTER_FEATURES: dict[str, frozenset[str]] = {
    "openai-compatible": frozenset({"tools", "json_schema", "vision", "embeddings"}),
    # Converse toolConfig for tools and JSON mode (adapters/converse_mapping); images refused (400).
    "bedrock": frozenset({"tools", "json_schema"}),
    # The same mapping, renamed to Messages (adapters/anthropic_mapping). Images: a /v1/messages
    # body goes as written, image blocks and all; a chat request's image_url parts become image
    # blocks (other part types are refused and the route moves on: adapters/base.unmapped_fields).
    "anthropic": frozenset({"tools", "json_schema", "vision"}),
}
# What each adapter serves whatever a deployment declares: properties of its wire format.
ADAPTER_INHERENT: dict[str, frozenset[str]] = {
    "openai-compatible": frozenset({TEXT_TOOL_ARGUMENTS}),  # carried as the client wrote them
    "bedrock": frozenset(),  # toolUse.input is a JSON object
    "anthropic": frozenset(),  # tool_use.input is a JSON object
}


def adapter_kind(provider_kind: str) -> str:
    """Bedrock speaks Converse and Anthropic-format providers Messages; every other provider kind
    (on-prem, cloud, openai-compatible, our own `serve_model`) is reached over the
    OpenAI-compatible HTTP API at its base URL."""
    return provider_kind if provider_kind in ("bedrock", "anthropic") else "openai-compatible"


def adapter_for(target: Target) -> Adapter:
    if target.refused:
        return _refused
    chaos = target.extra.get("chaos")
    return (_CHAOS if chaos else _ADAPTERS)[target.kind]
