"""bench gateway's figures for the agents' APIs (issue 29): a /v1/messages request (x-api-key) and a
/v1/responses request, each sent in turn with the chat request it translates to, so that both
see the same machine load; the paired difference is what the translation adds (target <= 0.3 ms)."""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.gateway.client import BODY, Client, percentiles


def translated_api_figures(
    chat: Client, port: int, token: str, model: str, *, n: int, warmup: int
) -> dict[str, float]:
    """<api>_p50_ms, <api>_chat_interleaved_p50_ms and <api>_added_to_chat_paired_p50_ms for
    messages and responses; `chat` is a client of /v1/chat/completions with the same key."""
    apis: dict[str, tuple[Client, dict[str, Any]]] = {
        "messages": (
            Client(port, "/v1/messages", {"x-api-key": token, "anthropic-version": "2023-06-01"}),
            {"model": model, "max_tokens": BODY["max_tokens"], "messages": BODY["messages"]},
        ),
        "responses": (
            Client(port, "/v1/responses", {"Authorization": f"Bearer {token}"}),
            {"model": model, "max_output_tokens": BODY["max_tokens"], "input": "ping"},
        ),
    }
    chat_doc = {"model": model, "messages": BODY["messages"], "max_completion_tokens": BODY["max_tokens"]}
    out: dict[str, float] = {}
    for name, (client, body) in apis.items():
        chat_samples: list[float] = []
        api_samples: list[float] = []
        for i in range(warmup + n):
            for caller, samples, doc_in in ((chat, chat_samples, chat_doc), (client, api_samples, body)):
                t0 = time.perf_counter()
                status, doc = caller.post(doc_in)
                if status != 200:
                    raise RuntimeError(f"gateway answered {status}: {doc}")
                if i >= warmup:
                    samples.append(time.perf_counter() - t0)
        out[f"{name}_p50_ms"], _ = percentiles(api_samples)
        out[f"{name}_chat_interleaved_p50_ms"], _ = percentiles(chat_samples)
        out[f"{name}_added_to_chat_paired_p50_ms"] = (
            statistics.median(a - c for a, c in zip(api_samples, chat_samples, strict=True)) * 1000.0
        )
    return out


def cache_figures(chat: Client, plain: str, cached: str, *, n: int, warmup: int) -> dict[str, float]:
    """The response cache (inference.cache), each figure paired with the same request to a workflow
    without a cache (same deployment), sent in turn:

    - cache_hit_p50_ms: a repeat answered from the cache (one Redis GET instead of the call);
    - cache_hit_vs_uncached_paired_p50_ms: hit minus the uncached request (negative: time saved);
    - cache_miss_added_paired_p50_ms: what the cache adds to a request it cannot answer (the
      lookup, then storing the answer), each a new body so that every one misses."""
    hit_body = {**BODY, "model": cached}
    status, doc = chat.post(hit_body)  # bought once; every later one is a hit
    if status != 200:
        raise RuntimeError(f"gateway answered {status}: {doc}")
    hits: list[float] = []
    plains: list[float] = []
    misses: list[float] = []
    plain_misses: list[float] = []
    for i in range(warmup + n):
        unique = [{"role": "user", "content": f"ping {i}"}]
        for body, samples in (
            (hit_body, hits),
            ({**BODY, "model": plain}, plains),
            ({**BODY, "model": cached, "messages": unique}, misses),
            ({**BODY, "model": plain, "messages": unique}, plain_misses),
        ):
            t0 = time.perf_counter()
            status, doc = chat.post(body)
            if status != 200:
                raise RuntimeError(f"gateway answered {status}: {doc}")
            if i >= warmup:
                samples.append(time.perf_counter() - t0)
    out: dict[str, float] = {}
    out["cache_hit_p50_ms"], _ = percentiles(hits)
    out["cache_uncached_interleaved_p50_ms"], _ = percentiles(plains)
    out["cache_hit_vs_uncached_paired_p50_ms"] = (
        statistics.median(h - p for h, p in zip(hits, plains, strict=True)) * 1000.0
    )
    out["cache_miss_added_paired_p50_ms"] = (
        statistics.median(m - p for m, p in zip(misses, plain_misses, strict=True)) * 1000.0
    )
    return out
