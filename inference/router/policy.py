"""The routing policy core: how a policy orders the deployments of a route. Pure Python, no Django.

It works on plain values (deployment ids and slugs, token prices as Decimal, rolling quality
scores, rolling p50 latencies), so every strategy is tested without a database or HTTP
(tests/inference/test_routing_core.py). inference.selectors builds the candidates of a route
from the database; inference.router executes the order (adapters, breakers, budgets, retries,
recording).

Strategies (registry.models.RoutingPolicyVersion.strategy stores the same values):

- priority: the policy's order;
- cheapest: lowest blended token price first (`blended_price`), unpriced last;
- fastest: lowest rolling p50 first, never-measured first so that they get measured;
- weighted: a weighted draw without replacement, so the weights split the first choice and the
  rest stay as fallbacks.

Under every strategy a deployment whose rolling quality is below the policy's floor is demoted
(left out of the order and reported with its score); one with no score yet is kept.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TypeVar

_rng = random.Random()  # noqa: S311 (load spreading, not security)


class Strategy(enum.StrEnum):
    PRIORITY = "priority"
    CHEAPEST = "cheapest"
    FASTEST = "fastest"
    WEIGHTED = "weighted"


class Peek(enum.IntEnum):
    """What a deployment's circuit breaker says before a call (inference.breaker.breakers's `peek`; its
    Lua scripts answer these numbers)."""

    OPEN = 0  # skip it: open (or its probe is in flight) and the cooldown has not passed
    CLOSED = 1  # call it
    HALF_OPEN = 2  # the cooldown passed: call it only if this caller claims the probe


def blended_price(input_price: Decimal | None, output_price: Decimal | None) -> Decimal | None:
    """$/1M tokens with output weighted 3:1, the usual chat mix, to rank by cost; None when the
    deployment has neither price."""
    if input_price is None and output_price is None:
        return None
    return ((input_price or Decimal(0)) + 3 * (output_price or Decimal(0))) / 4


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One deployment of a route, as the strategies see it."""

    deployment_id: int
    slug: str
    position: int  # in the policy's route
    weight: int
    # Token prices ($/1M) in force when the route was loaded; None: no per-token price.
    input_price: Decimal | None
    output_price: Decimal | None
    currency: str = "USD"

    @property
    def blended_price(self) -> Decimal | None:
        return blended_price(self.input_price, self.output_price)


@dataclass(frozen=True)
class Policy:
    """What orders a route: the strategy and the quality floor (None: no floor)."""

    strategy: str
    quality_floor: float | None = None

    @property
    def needs_quality(self) -> bool:
        """Whether ordering reads rolling quality scores."""
        return self.quality_floor is not None

    @property
    def needs_latency(self) -> bool:
        """Whether ordering reads rolling p50 latencies."""
        return self.strategy == Strategy.FASTEST


C = TypeVar("C", bound=Candidate)


def order_candidates(
    policy: Policy,
    candidates: Sequence[C],
    *,
    quality: Mapping[int, float | None],
    p50s: Mapping[int, float | None],
    rng: random.Random = _rng,
) -> tuple[list[C], list[tuple[C, float]]]:
    """(the candidates to try, in order; the ones demoted for quality, with their score).

    `quality` and `p50s` are keyed by deployment id (None or missing: not measured yet); see
    the module docstring for what each strategy does.
    """
    floor = policy.quality_floor
    keep: list[C] = []
    demoted: list[tuple[C, float]] = []
    for c in candidates:
        score = quality.get(c.deployment_id)
        if floor is not None and score is not None and score < floor:
            demoted.append((c, score))
        else:
            keep.append(c)
    strategy = policy.strategy
    if strategy == Strategy.CHEAPEST:
        keep.sort(key=lambda c: (c.blended_price is None, c.blended_price or Decimal(0), c.position))
    elif strategy == Strategy.FASTEST:
        keep.sort(
            key=lambda c: (
                p50s.get(c.deployment_id) is not None,
                p50s.get(c.deployment_id) or 0.0,
                c.position,
            )
        )
    elif strategy == Strategy.WEIGHTED:
        keep = _weighted_order(keep, rng)
    return keep, demoted


def _weighted_order(candidates: Sequence[C], rng: random.Random) -> list[C]:
    """A weighted draw without replacement (weights below 0 count as 0; when every weight left
    is 0, the rest keep their order)."""
    pool = list(candidates)
    out: list[C] = []
    while pool:
        total = sum(max(c.weight, 0) for c in pool)
        if total <= 0:
            out.extend(pool)
            break
        pick = rng.uniform(0, total)
        acc = 0.0
        for i, c in enumerate(pool):
            acc += max(c.weight, 0)
            if pick <= acc:
                out.append(pool.pop(i))
                break
        else:
            out.append(pool.pop())
    return out
