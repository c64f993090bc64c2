"""The routing core (inference.router.policy): strategies over plain values, no database, no HTTP."""

from __future__ import annotations

import random
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

from inference.router.policy import Candidate, Peek, Policy, Strategy, blended_price, order_candidates


def _candidate(pk: int, *, price: str | None = None, weight: int = 1) -> Candidate:
    p = Decimal(price) if price is not None else None
    return Candidate(
        deployment_id=pk, slug=f"d{pk}", position=pk, weight=weight, input_price=p, output_price=p
    )


def _slugs(candidates: list[Candidate]) -> list[str]:
    return [c.slug for c in candidates]


def test_priority_keeps_policy_order() -> None:
    policy = Policy(strategy=Strategy.PRIORITY)
    order, demoted = order_candidates(
        policy, [_candidate(1, price="9"), _candidate(2, price="1")], quality={}, p50s={}
    )
    assert _slugs(order) == ["d1", "d2"] and demoted == []


def test_cheapest_respects_the_quality_floor() -> None:
    policy = Policy(strategy=Strategy.CHEAPEST, quality_floor=0.7)
    candidates = [_candidate(1, price="5"), _candidate(2, price="1"), _candidate(3, price="2"), _candidate(4)]
    order, demoted = order_candidates(policy, candidates, quality={1: 0.9, 2: 0.5, 3: 0.8, 4: None}, p50s={})
    assert _slugs(order) == ["d3", "d1", "d4"]  # d2 is cheapest but below the floor; unpriced last
    assert [(c.slug, s) for c, s in demoted] == [("d2", 0.5)]


def test_cheapest_ranks_by_the_blended_price_with_output_weighted_three_to_one() -> None:
    dear_output = Candidate(
        deployment_id=1,
        slug="d1",
        position=0,
        weight=1,
        input_price=Decimal("1"),
        output_price=Decimal("10"),
    )
    dear_input = Candidate(
        deployment_id=2,
        slug="d2",
        position=1,
        weight=1,
        input_price=Decimal("10"),
        output_price=Decimal("2"),
    )
    assert dear_output.blended_price == Decimal("7.75") and dear_input.blended_price == Decimal("4")
    order, _ = order_candidates(
        Policy(strategy=Strategy.CHEAPEST), [dear_output, dear_input], quality={}, p50s={}
    )
    assert _slugs(order) == ["d2", "d1"]
    assert blended_price(None, None) is None and blended_price(Decimal("2"), None) == Decimal("0.5")


def test_fastest_orders_by_rolling_p50_and_measures_the_unknown_first() -> None:
    policy = Policy(strategy=Strategy.FASTEST)
    order, _ = order_candidates(
        policy, [_candidate(1), _candidate(2), _candidate(3)], quality={}, p50s={1: 40.0, 2: 5.0, 3: None}
    )
    assert _slugs(order) == ["d3", "d2", "d1"]


def test_weighted_splits_the_first_choice_by_weight() -> None:
    policy = Policy(strategy=Strategy.WEIGHTED)
    candidates = [_candidate(1, weight=3), _candidate(2, weight=1)]
    rng = random.Random(7)
    firsts = [order_candidates(policy, candidates, quality={}, p50s={}, rng=rng)[0] for _ in range(2000)]
    share = sum(1 for order in firsts if order[0].deployment_id == 1) / len(firsts)
    assert 0.70 < share < 0.80
    assert all(len(order) == 2 for order in firsts)  # the other stays as the fallback


def test_weighted_keeps_zero_weights_as_fallbacks_in_policy_order() -> None:
    policy = Policy(strategy=Strategy.WEIGHTED)
    candidates = [_candidate(1, weight=0), _candidate(2, weight=0), _candidate(3, weight=1)]
    order, _ = order_candidates(policy, candidates, quality={}, p50s={}, rng=random.Random(1))
    assert _slugs(order) == ["d3", "d1", "d2"]


def test_a_policy_says_which_rolling_figures_it_reads() -> None:
    assert not Policy(strategy=Strategy.PRIORITY).needs_quality
    assert Policy(strategy=Strategy.PRIORITY, quality_floor=0.5).needs_quality
    assert Policy(strategy=Strategy.FASTEST).needs_latency
    assert not Policy(strategy=Strategy.CHEAPEST).needs_latency


def test_peek_numbers_are_the_ones_the_breaker_scripts_answer() -> None:
    assert (Peek.OPEN, Peek.CLOSED, Peek.HALF_OPEN) == (0, 1, 2)


def test_the_core_imports_no_django() -> None:
    probe = "import sys, inference.router.policy; print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"
