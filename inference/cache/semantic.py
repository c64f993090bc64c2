"""Semantic matching for the response cache: opt-in per workflow on top of the exact cache, off by
default (Workflow.semantic_cache_threshold null).

A request the exact cache misses is answered from the cache when its prompt means what a cached
prompt meant: the cosine similarity of the two prompts' embeddings is at least the workflow's
threshold, and everything else in the body (model, tools, sampling options, response format) is
equal. The embedding comes from the workflow's embeddings deployment (semantic_cache_deployment),
called by the router as a request of its own: billed, recorded and in the ledger like any other
(inference.router.entry), so the cost of matching sits beside the cost the hits avoided.

What is matched: the prompt's text, written as "role: text" lines (chat messages, Messages'
system and messages, Responses' instructions and input, a completion's prompt). A prompt with
anything but text in it (images, tool calls, tool results) or longer than MAX_PROMPT_CHARS is
matched exactly or not at all. The rest of the body is the "scope": its digest names the index,
so only prompts asked the same way are compared.

What is stored: per scope, the unit-length float32 embedding of each cached prompt and when it
was stored, under the exact cache's key of its answer (inference.cache.exact holds the answer).
An embedding says more about a prompt than a hash does, so the registry allows semantic
matching only to a workflow that keeps its prompts (registry.services.workflow_semantic_check),
and the embeddings live no longer than its answers: the cache's time, which is never longer
than the prompts' retention (a lookup drops the scope's embeddings past it; a scope's index
expires that long after its last write). At most response_cache_entries embeddings per scope
(and MAX_SCOPE_ENTRIES), oldest dropped first. Like the exact cache, matching ignores `user`:
an answer serves every end user of the workflow whose prompt is that similar. The index names the workflow, its team, the route version and the embeddings
deployment, so a route switch, a move to another team or another embedder starts it empty;
turning matching off forgets it (inference.signals).

Cost of a lookup: one embedding call and one read of the scope's embeddings (Redis HGETALL: for
1,000 prompts of 1,536 dimensions, 6 MB), then one matrix-vector product. Redis down: a miss.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.conf import settings

from inference.cache.exact import (
    PREFIX,
    REDIS_TIMEOUT_S,
    CacheAsk,
    body_digest,
    cache_seconds,
    redis_delete_prefixed,
    store_for_url,
)
from registry.models import Workflow
from registry.shared_redis.client import REDIS_DOWN_ERRORS, redis_client

logger = logging.getLogger(__name__)

# The body fields of each API that hold the prompt; the rest of the body is the scope.
PROMPT_FIELDS: dict[str, frozenset[str]] = {
    "chat": frozenset({"messages"}),
    "completion": frozenset({"prompt"}),
    "messages": frozenset({"system", "messages"}),
    "responses": frozenset({"instructions", "input"}),
}
MAX_PROMPT_CHARS = 8_000  # longer prompts are matched exactly only
MAX_DIMENSIONS = 16_384
CANDIDATES = 3  # similar prompts tried, most similar first, when an answer has gone meanwhile
# Embeddings kept per scope, whatever response_cache_entries allows: a lookup reads them all
# (10,000 of 1,536 dimensions: 61 MB), so the bound keeps a lookup inside Redis's timeout.
MAX_SCOPE_ENTRIES = 10_000
_ROLES = frozenset({"system", "developer", "user", "assistant"})
_STAMP = struct.Struct("<d")  # when the embedding was stored, before its float32 values


@dataclass(frozen=True)
class SemanticAsk:
    """A request semantic matching may answer: its prompt's text and the digest of the rest."""

    text: str
    scope: str


@dataclass(frozen=True)
class SemanticMatch:
    key: str  # the exact cache's key of the similar prompt's answer
    similarity: float


def semantic_on(workflow: Workflow) -> bool:
    return (
        workflow.semantic_cache_threshold is not None
        and workflow.semantic_cache_deployment_id is not None
        and workflow.retain_prompts
        and cache_seconds(workflow) > 0
    )


def semantic_ask(ask: CacheAsk) -> SemanticAsk | None:
    """The prompt text and scope of `ask`, or None when its prompt is not text alone (or too long)."""
    fields = PROMPT_FIELDS.get(ask.api)
    if fields is None:
        return None
    text = _prompt_text(ask.api, ask.body)
    if text is None or not text.strip() or len(text) > MAX_PROMPT_CHARS:
        return None
    return SemanticAsk(text=text, scope=body_digest(ask.api, ask.body, leave_out=fields))


def _text(content: Any, part_types: frozenset[str]) -> str | None:
    """A message's content as text: a string, or parts that are all text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        return None
    texts = []
    for part in content:
        if (
            not isinstance(part, dict)
            or part.get("type") not in part_types
            or not isinstance(part.get("text"), str)
            or set(part) - {"type", "text", "cache_control"}
        ):
            return None
        texts.append(part["text"])
    return "\n".join(texts)


def _turns(messages: Any, part_types: frozenset[str], keys: frozenset[str]) -> list[str] | None:
    if not isinstance(messages, list) or not messages:
        return None
    lines = []
    for m in messages:
        if not isinstance(m, dict) or set(m) - keys or m.get("role") not in _ROLES:
            return None
        if m.get("type", "message") != "message":  # a Responses item that is not a message
            return None
        text = _text(m.get("content"), part_types)
        if text is None:
            return None
        lines.append(f"{m['role']}: {text}")
    return lines


_TEXT = frozenset({"text"})
_RESPONSES_TEXT = frozenset({"input_text", "output_text"})
_ROLE_CONTENT = frozenset({"role", "content"})


def _prompt_text(api: str, body: dict[str, Any]) -> str | None:
    lines: list[str] | None
    if api == "completion":
        prompt = body.get("prompt")
        return prompt if isinstance(prompt, str) else None
    if api == "chat":
        lines = _turns(body.get("messages"), _TEXT, _ROLE_CONTENT)
    elif api == "messages":
        system = body.get("system")
        head = _text(system, _TEXT) if system is not None else ""
        turns = _turns(body.get("messages"), _TEXT, _ROLE_CONTENT)
        if head is None or turns is None:
            return None
        lines = ([f"system: {head}"] if head else []) + turns
    else:  # responses
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            return None
        given = body.get("input")
        turns = (
            [f"user: {given}"]
            if isinstance(given, str)
            else _turns(given, _RESPONSES_TEXT, _ROLE_CONTENT | {"type"})
        )
        if turns is None:
            return None
        lines = ([f"system: {instructions}"] if instructions else []) + turns
    return "\n".join(lines) if lines is not None else None


def embedding_vector(raw: Any) -> np.ndarray | None:
    """The first embedding of an OpenAI embeddings document, at unit length (None if unusable)."""
    try:
        values = raw["data"][0]["embedding"]
        if not isinstance(values, list) or not 0 < len(values) <= MAX_DIMENSIONS:
            return None
        vector = np.asarray(values, dtype=np.float32)
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    norm = float(np.linalg.norm(vector)) if vector.ndim == 1 and np.all(np.isfinite(vector)) else 0.0
    return vector / norm if norm > 0 else None


def _index(workflow: Workflow, policy_id: int | None, scope: str) -> str:
    return (
        f"{PREFIX}sem:{workflow.pk}:{workflow.team_id or 0}:{policy_id or 0}:"
        f"{workflow.semantic_cache_deployment_id or 0}:{scope}"
    )


def _encode(vector: np.ndarray, stored_at: float) -> bytes:
    return _STAMP.pack(stored_at) + vector.astype("<f4").tobytes()


def _decode(value: bytes, dimensions: int) -> tuple[float, np.ndarray] | None:
    if len(value) != _STAMP.size + 4 * dimensions:
        return None  # another embedder's length, or not ours
    (stored_at,) = _STAMP.unpack_from(value)
    return stored_at, np.frombuffer(value, dtype="<f4", offset=_STAMP.size)


class _LocalIndexes:
    """Embeddings in this process (no REDIS_URL), per index in insertion order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._indexes: dict[str, OrderedDict[str, bytes]] = {}

    def entries(self, index: str) -> dict[str, bytes]:
        with self._lock:
            return dict(self._indexes.get(index, {}))

    def put(self, index: str, key: str, value: bytes, *, ttl: int, entries: int) -> None:
        with self._lock:
            kept = self._indexes.setdefault(index, OrderedDict())
            kept.pop(key, None)
            kept[key] = value
            while len(kept) > entries:
                kept.popitem(last=False)

    def discard(self, index: str, *keys: str) -> None:
        with self._lock:
            kept = self._indexes.get(index, OrderedDict())
            for key in keys:
                kept.pop(key, None)

    def forget(self, prefix: str) -> None:
        with self._lock:
            for index in [i for i in self._indexes if i.startswith(prefix)]:
                del self._indexes[index]


class _RedisIndexes:
    """Embeddings in Redis: one hash per index (exact key -> stamp and values), expiring with the
    cache's time from its last write; trimmed to the entry bound, oldest first."""

    def __init__(self, url: str) -> None:
        self.redis = redis_client(url, timeout=REDIS_TIMEOUT_S)

    def entries(self, index: str) -> dict[str, bytes]:
        found: dict[bytes, bytes] = self.redis.hgetall(index)  # type: ignore[assignment]
        return {k.decode(): v for k, v in found.items()}

    def put(self, index: str, key: str, value: bytes, *, ttl: int, entries: int) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(index, key, value)
        pipe.expire(index, ttl)
        pipe.hlen(index)
        size = pipe.execute()[-1]
        if size > entries:
            kept = self.entries(index)
            oldest = sorted(kept, key=lambda k: _STAMP.unpack_from(kept[k])[0] if len(kept[k]) >= 8 else 0.0)
            self.redis.hdel(index, *oldest[: size - entries])

    def discard(self, index: str, *keys: str) -> None:
        self.redis.hdel(index, *keys)

    def forget(self, prefix: str) -> None:
        redis_delete_prefixed(self.redis, prefix)


_local = _LocalIndexes()
_stores: dict[str, _RedisIndexes] = {}


def _store() -> _LocalIndexes | _RedisIndexes:
    return store_for_url(_local, _stores, _RedisIndexes)


def semantic_lookup(
    workflow: Workflow, policy_id: int | None, ask: SemanticAsk, vector: np.ndarray
) -> list[SemanticMatch]:
    """Cached prompts of the scope at least the threshold similar to `vector`, most similar first
    (at most CANDIDATES), stored within the cache's time."""
    seconds = cache_seconds(workflow)
    if workflow.semantic_cache_threshold is None or not seconds:
        return []
    try:
        kept = _store().entries(_index(workflow, policy_id, ask.scope))
    except REDIS_DOWN_ERRORS:
        return []
    now, keys, rows, stale = time.time(), [], [], []
    for key, value in kept.items():
        decoded = _decode(value, vector.shape[0])
        if decoded is not None and decoded[0] + seconds > now:
            keys.append(key)
            rows.append(decoded[1])
        elif decoded is not None:
            stale.append(key)  # past the cache's time: dropped now, not only by the size bound
    if stale:
        _drop(_index(workflow, policy_id, ask.scope), stale)
    if not rows:
        return []
    similarity = np.stack(rows) @ vector
    threshold = float(workflow.semantic_cache_threshold)
    best = np.argsort(-similarity, kind="stable")[:CANDIDATES]
    return [SemanticMatch(keys[i], float(similarity[i])) for i in best if similarity[i] >= threshold]


def semantic_put(
    workflow: Workflow, policy_id: int | None, ask: SemanticAsk, vector: np.ndarray, key: str
) -> None:
    """Index the embedding of a prompt whose answer the exact cache now holds under `key`."""
    seconds = cache_seconds(workflow)
    if not seconds:
        return
    value = _encode(vector, time.time())
    try:
        _store().put(
            _index(workflow, policy_id, ask.scope),
            key,
            value,
            ttl=seconds,
            entries=min(workflow.response_cache_entries, MAX_SCOPE_ENTRIES),
        )
    except REDIS_DOWN_ERRORS:
        logger.warning("semantic cache: Redis unreachable, a prompt of %s not indexed", workflow.slug)


def semantic_discard(workflow: Workflow, policy_id: int | None, ask: SemanticAsk, key: str) -> None:
    """Drop an embedding whose answer the exact cache no longer holds."""
    _drop(_index(workflow, policy_id, ask.scope), [key])


def _drop(index: str, keys: list[str]) -> None:
    try:
        _store().discard(index, *keys)
    except REDIS_DOWN_ERRORS:
        # Dropped by the next lookup that finds them, or they expire with their index.
        logger.debug("semantic cache: Redis unreachable, %d embeddings left to expire", len(keys))


def semantic_forget(workflow_id: int) -> None:
    """Forget every embedding of the workflow (matching turned off: inference.signals)."""
    prefix = f"{PREFIX}sem:{workflow_id}:"
    _local.forget(prefix)
    if settings.REDIS_URL:
        try:
            _store().forget(prefix)
        except REDIS_DOWN_ERRORS:
            logger.warning(
                "semantic cache: Redis unreachable, workflow %s's embeddings expire by TTL", workflow_id
            )


def semantic_clear() -> None:
    """Forget every embedding in this process (Redis keys go with the exact cache's clear)."""
    _local.forget(PREFIX)
