"""How often semantic matching (inference.cache.semantic) would answer wrongly, measured on a
workflow's eval sets before it is turned on (`manage.py cache_study`).

Each eval case's prompt is embedded the way the cache embeds a one-message chat request, by the
embeddings deployment that would do it (each call a billed request of the workflow, as the cache's
are). Then, leave one out: the cache is taken to hold every other case's answer, and each case is
asked of it. At a threshold, a case is a *hit* when its most similar other case is at least that
similar, and a *false hit* when that case expects another answer (expected texts compared with
case and surrounding space ignored). Cases with no expected text (judged ones) are left out.

false_hit_rate is false hits per case asked: the share of requests the cache would answer with
another question's answer. It is as good as the eval set is varied: a set of unrelated questions
says little about near-misses, a set with paraphrases and near-misses says a lot.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import numpy as np

from inference.adapters.base import EmbeddingRequest
from inference.cache import CacheAsk, embedding_vector, semantic_ask
from inference.models import Endpoint, EvalCase
from inference.router.entry import route
from registry.models import Deployment, Workflow

DEFAULT_THRESHOLDS = (0.8, 0.85, 0.9, 0.95, 0.98)


class StudyError(ValueError):
    """The study cannot run (no cases, an embedder that does not answer); one readable line."""


def semantic_cache_study(
    *,
    workflow: Workflow,
    embedder: Deployment,
    cases: Sequence[EvalCase],
    thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
) -> dict[str, Any]:
    """The hit and false-hit rates of semantic matching on `cases` at each threshold (see the
    module docstring), with what embedding them cost."""
    judged = [c for c in cases if c.expected.strip()]
    if len(judged) < 2:
        raise StudyError("the study needs at least 2 eval cases with an expected answer")
    vectors: list[np.ndarray] = []
    cost, currency = Decimal(0), "USD"
    for case in judged:
        ask = semantic_ask(CacheAsk("chat", {"messages": [{"role": "user", "content": case.prompt}]}))
        if ask is None:
            raise StudyError(f"eval case {case.pk}: its prompt is empty or longer than the cache embeds")
        result = route(
            workflow=workflow,
            request=EmbeddingRequest(texts=(ask.text,)),
            endpoint=Endpoint.EMBEDDING,
            deployment=embedder,
        )
        vector = embedding_vector(result.completion.raw) if result.ok and result.completion else None
        if vector is None:
            raise StudyError(
                f"deployment {embedder.slug} gave no embedding: {result.error or 'unusable answer'}"
            )
        if vectors and vector.shape != vectors[0].shape:
            raise StudyError(f"deployment {embedder.slug} answered embeddings of different lengths")
        vectors.append(vector)
        cost += result.cost
        currency = result.currency
    similarity = np.stack(vectors) @ np.stack(vectors).T
    np.fill_diagonal(similarity, -np.inf)  # a case never answers itself
    nearest = similarity.argmax(axis=1)
    best = similarity[np.arange(len(judged)), nearest]
    expected = [c.expected.strip().casefold() for c in judged]
    wrong = np.array([expected[i] != expected[j] for i, j in enumerate(nearest)])
    rows = []
    for threshold in sorted(thresholds):
        hit = best >= threshold
        hits, false_hits = int(hit.sum()), int((hit & wrong).sum())
        rows.append(
            {
                "threshold": threshold,
                "hits": hits,
                "hit_rate": round(hits / len(judged), 4),
                "false_hits": false_hits,
                "false_hit_rate": round(false_hits / len(judged), 4),
                "false_share_of_hits": round(false_hits / hits, 4) if hits else None,
            }
        )
    return {
        "workflow": workflow.slug,
        "embedder": embedder.slug,
        "cases": len(judged),
        "cases_left_out_without_expected": len(cases) - len(judged),
        "embedding_cost": f"{cost:f}",
        "currency": currency,
        "thresholds": rows,
    }
