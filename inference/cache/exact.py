"""The response cache's exact match: a workflow that opts in (Workflow.response_cache_seconds >
0) answers an exact repeat of a request from the answer bought the first time, for a zero-cost
ledger row that records the cost it avoided. (Semantic matching, opted in on top of it, is
inference.cache.semantic.)

What counts as a repeat: the same API (chat, completion, messages, responses) and the same body
less what cannot change the answer (`stream`, `stream_options`, `user`, `metadata`), for the same
workflow at the same routing-policy version. The key is a SHA-256 of those, so nothing of the
prompt is stored; the value is the answer (the chat-level document and its token counts), the
deployment that gave it and what it cost. Never across workflows (so never across teams): the
key starts with the workflow's id. A new policy version (a switch of the primary, a new route)
changes the key, so nothing cached before it is served after it.

How long: the workflow's response_cache_seconds, and for a workflow that keeps prompts never
longer than its prompt_retention_days (no cached answer outlives the retention); a shorter
setting applies to answers cached before it (each carries the time it was stored). How many:
at most response_cache_entries answers per workflow, the oldest evicted first.

Where: Redis when REDIS_URL is set (one GET per lookup; shared by every web process); otherwise
this process's memory (the embedded demo). Redis down: a lookup is a miss and nothing is stored,
never an error. Streamed requests, requests with an Idempotency-Key (they have their own replay,
inference.idempotency) and embeddings are never cached.

The router (inference.router.entry.route) asks and records: a hit is recorded as a request of
the cached deployment with cost 0 and `cost_avoided` set, on the request row and on its ledger
row (billing's UsageRecord.cost_avoided, exported as x_CostAvoided).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

from django.conf import settings

from inference.adapters.base import Completion
from registry.models import Workflow
from registry.shared_redis.client import REDIS_DOWN_ERRORS, redis_client

logger = logging.getLogger(__name__)
L = TypeVar("L")
R = TypeVar("R")

PREFIX = "sy:rc:"
# Body fields that cannot change the answer (how it is delivered, who to attribute it to).
NOT_ANSWER = frozenset({"stream", "stream_options", "user", "metadata"})
REDIS_TIMEOUT_S = 0.25  # a slow Redis is a miss, never a slow answer
DAY_SECONDS = 86_400


@dataclass(frozen=True)
class CacheAsk:
    """What the gateway hands the router for a request the cache may answer: its API and body."""

    api: str
    body: dict[str, Any]


@dataclass(frozen=True)
class CachedAnswer:
    deployment_id: int
    cost: Decimal
    currency: str
    completion: Completion
    stored_at: float


def cache_seconds(workflow: Workflow) -> int:
    """How long the workflow's answers are served from the cache (0: not cached)."""
    seconds = workflow.response_cache_seconds
    if seconds and workflow.retain_prompts and workflow.prompt_retention_days:
        seconds = min(seconds, workflow.prompt_retention_days * DAY_SECONDS)
    return seconds


def body_digest(api: str, body: dict[str, Any], *, leave_out: frozenset[str] = frozenset()) -> str:
    """SHA-256 of the API and the body less NOT_ANSWER (and `leave_out`), keys sorted."""
    normal = {k: v for k, v in body.items() if k not in NOT_ANSWER and k not in leave_out}
    text = json.dumps([api, normal], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def cache_key(ask: CacheAsk, *, workflow: Workflow, policy_id: int | None) -> str:
    """The workflow, its team (a workflow moved to another team starts an empty cache), the
    route version and the digest of the API and the body less NOT_ANSWER."""
    digest = body_digest(ask.api, ask.body)
    return f"{PREFIX}{workflow.pk}:{workflow.team_id or 0}:{policy_id or 0}:{digest}"


def _index_key(workflow_id: int) -> str:
    return f"{PREFIX}idx:{workflow_id}"


def _encode(answer: CachedAnswer) -> bytes:
    c = answer.completion
    doc = {
        "d": answer.deployment_id,
        "c": str(answer.cost),
        "cur": answer.currency,
        "t": answer.stored_at,
        "x": c.text,
        "i": c.tokens_in,
        "o": c.tokens_out,
        "f": c.finish_reason,
        "k": c.cached_tokens,
        "w": c.cache_write_tokens,
        "r": c.reasoning_tokens,
        "raw": c.raw,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def _decode(data: bytes) -> CachedAnswer:
    doc = json.loads(data)
    completion = Completion(
        text=doc["x"],
        tokens_in=doc["i"],
        tokens_out=doc["o"],
        finish_reason=doc["f"],
        cached_tokens=doc["k"],
        cache_write_tokens=doc.get("w", 0),  # entries stored before cache writes were counted
        reasoning_tokens=doc["r"],
        raw=doc["raw"],
    )
    return CachedAnswer(doc["d"], Decimal(doc["c"]), doc["cur"], completion, float(doc["t"]))


class _LocalStore:
    """Answers in this process, per workflow in insertion order (no REDIS_URL)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_workflow: dict[int, OrderedDict[str, tuple[bytes, float]]] = {}

    def get(self, workflow_id: int, key: str) -> bytes | None:
        with self._lock:
            hit = self._by_workflow.get(workflow_id, OrderedDict()).get(key)
        if hit is None or hit[1] <= time.time():
            return None
        return hit[0]

    def put(self, workflow_id: int, key: str, value: bytes, *, ttl: int, entries: int) -> None:
        with self._lock:
            answers = self._by_workflow.setdefault(workflow_id, OrderedDict())
            answers.pop(key, None)
            answers[key] = (value, time.time() + ttl)
            while len(answers) > entries:
                answers.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._by_workflow.clear()


class _RedisStore:
    """Answers in Redis: each under its key with the TTL, and a per-workflow index (a sorted set
    by store time) that bounds how many the workflow keeps."""

    def __init__(self, url: str) -> None:
        self.redis = redis_client(url, timeout=REDIS_TIMEOUT_S)

    def get(self, workflow_id: int, key: str) -> bytes | None:
        value = self.redis.get(key)
        return value if isinstance(value, bytes) else None

    def put(self, workflow_id: int, key: str, value: bytes, *, ttl: int, entries: int) -> None:
        index, now = _index_key(workflow_id), time.time()
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(key, value, ex=ttl)
        pipe.zadd(index, {key: now})
        pipe.zremrangebyscore(index, "-inf", now - ttl)  # entries that expired by themselves
        pipe.expire(index, ttl)
        pipe.zcard(index)
        size = pipe.execute()[-1]
        if size > entries:
            popped: list[tuple[bytes, float]] = self.redis.zpopmin(index, size - entries)  # type: ignore[assignment]
            evicted = [key for key, _ in popped]
            if evicted:
                self.redis.delete(*evicted)

    def clear(self) -> None:
        redis_delete_prefixed(self.redis, PREFIX)


def redis_delete_prefixed(redis: Any, prefix: str) -> None:
    """Delete every key that starts with `prefix` (SCAN, then one DELETE)."""
    keys = list(redis.scan_iter(f"{prefix}*"))
    if keys:
        redis.delete(*keys)


def store_for_url(local: L, shared: dict[str, R], make: Callable[[str], R]) -> L | R:
    """This process's `local` store without REDIS_URL, else the one Redis store per URL."""
    url = settings.REDIS_URL
    if not url:
        return local
    store = shared.get(url)
    if store is None:
        store = shared[url] = make(url)
    return store


_local = _LocalStore()
_stores: dict[str, _RedisStore] = {}


def _store() -> _LocalStore | _RedisStore:
    return store_for_url(_local, _stores, _RedisStore)


def cache_get(workflow: Workflow, key: str) -> CachedAnswer | None:
    """The cached answer under `key` if it is younger than the workflow's cache time now."""
    seconds = cache_seconds(workflow)
    if not seconds:
        return None
    try:
        data = _store().get(workflow.pk, key)
    except REDIS_DOWN_ERRORS:
        return None
    if data is None:
        return None
    try:
        answer = _decode(data)
    except (ValueError, KeyError, TypeError):
        return None  # not an answer this version wrote: a miss, which overwrites it
    if answer.stored_at + seconds <= time.time():
        return None  # the setting was shortened (or prompts' retention) since it was stored
    return answer


def cache_put(workflow: Workflow, key: str, answer: CachedAnswer) -> None:
    seconds = cache_seconds(workflow)
    if not seconds:
        return
    try:
        _store().put(workflow.pk, key, _encode(answer), ttl=seconds, entries=workflow.response_cache_entries)
    except REDIS_DOWN_ERRORS:
        logger.warning("response cache: Redis unreachable, answer of %s not cached", workflow.slug)


def exact_clear() -> None:
    """Forget every cached answer, and in Redis every key of the cache (inference.cache.cache_clear)."""
    _local.clear()
    if settings.REDIS_URL:
        _store().clear()
