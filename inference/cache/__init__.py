"""The response cache: exact repeats (inference.cache.exact) and, opted in on top of it, prompts
that mean the same (inference.cache.semantic). The router (inference.router.entry) asks both."""

from inference.cache.exact import (
    CacheAsk,
    CachedAnswer,
    cache_get,
    cache_key,
    cache_put,
    cache_seconds,
    exact_clear,
)
from inference.cache.semantic import (
    SemanticAsk,
    SemanticMatch,
    embedding_vector,
    semantic_ask,
    semantic_clear,
    semantic_discard,
    semantic_forget,
    semantic_lookup,
    semantic_on,
    semantic_put,
)

__all__ = [
    "CacheAsk",
    "CachedAnswer",
    "SemanticAsk",
    "SemanticMatch",
    "cache_clear",
    "cache_get",
    "cache_key",
    "cache_put",
    "cache_seconds",
    "embedding_vector",
    "semantic_ask",
    "semantic_discard",
    "semantic_forget",
    "semantic_lookup",
    "semantic_on",
    "semantic_put",
]


def cache_clear() -> None:
    """Forget every cached answer and embedding (tests; an operator flushing the cache)."""
    exact_clear()  # in Redis, every key of the cache, embeddings included
    semantic_clear()
