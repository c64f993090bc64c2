"""Which adapter serves which provider kind."""

from __future__ import annotations

from inference.adapters.base import Adapter, Target
from inference.adapters.bedrock import BedrockAdapter
from inference.adapters.chaos import ChaosAdapter
from inference.adapters.openai_compat import OpenAICompatibleAdapter

_openai = OpenAICompatibleAdapter()
_bedrock = BedrockAdapter()
_ADAPTERS: dict[str, Adapter] = {"openai-compatible": _openai, "bedrock": _bedrock}
_CHAOS: dict[str, Adapter] = {kind: ChaosAdapter(inner) for kind, inner in _ADAPTERS.items()}


# What each adapter maps today; a deployment's declared capabilities are limited to these.
ADAPTER_FEATURES: dict[str, frozenset[str]] = {
    "openai-compatible": frozenset({"tools", "json_schema", "vision", "embeddings"}),
    "bedrock": frozenset(),  # Converse text only: tools, JSON schema, images refused (400)
}


def adapter_kind(provider_kind: str) -> str:
    """Bedrock speaks Converse; every other provider kind (on-prem, cloud, openai-compatible,
    our own `serve_model`) is reached over the OpenAI-compatible HTTP API at its base URL."""
    return "bedrock" if provider_kind == "bedrock" else "openai-compatible"


def adapter_for(target: Target) -> Adapter:
    chaos = target.extra.get("chaos")
    return (_CHAOS if chaos else _ADAPTERS)[target.kind]
