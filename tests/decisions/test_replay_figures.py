"""The replay figures (pure functions): t intervals in Decimal, percentiles, the seeded bootstrap,
paired differences."""

from __future__ import annotations

import math
import random
import statistics
from decimal import Decimal

import pytest

from decisions.replay.figures import (
    bootstrap_half_width,
    candidate_figures,
    mean_ci,
    paired_figures,
    percentile,
    t_quantile_975,
)


@pytest.mark.parametrize(
    ("df", "expected"),
    # Student's t 0.975 quantiles from the standard tables.
    [(1, 12.7062), (5, 2.5706), (11, 2.2010), (20, 2.0860), (30, 2.0423), (99, 1.9842), (1000, 1.9623)],
)
def test_the_t_quantile_matches_the_tables(df: int, expected: float) -> None:
    assert t_quantile_975(df) == pytest.approx(expected, abs=2e-4)


def test_the_mean_interval_is_the_t_interval_in_decimal() -> None:
    values = [Decimal("0.000010"), Decimal("0.000012"), Decimal("0.000011"), Decimal("0.000015")]
    ci = mean_ci(values)
    assert ci is not None and ci.n == 4
    assert ci.mean == Decimal("0.000012")  # exact: no float in between
    s = statistics.stdev([float(v) for v in values])
    assert float(ci.half_width or 0) == pytest.approx(3.182446 * s / math.sqrt(4), rel=1e-9)
    assert mean_ci([]) is None
    one = mean_ci([Decimal("2")])
    assert one is not None and one.half_width is None


def test_percentiles_interpolate_between_order_statistics() -> None:
    values = [float(v) for v in range(1, 11)]  # 1..10
    assert percentile(values, 50) == 5.5
    assert percentile(values, 95) == pytest.approx(9.55)
    assert percentile([3.0], 95) == 3.0


def test_the_bootstrap_is_seeded_and_shrinks_with_more_data() -> None:
    rng = random.Random(7)
    small = [rng.lognormvariate(3, 0.5) for _ in range(30)]
    large = [rng.lognormvariate(3, 0.5) for _ in range(1000)]
    first = bootstrap_half_width(small, 95)
    assert first is not None and first > 0
    assert bootstrap_half_width(small, 95) == first  # deterministic
    large_width = bootstrap_half_width(large, 95)
    assert large_width is not None and large_width < first
    assert bootstrap_half_width([1.0], 95) is None


def test_candidate_figures_keep_money_exact_and_scale_to_a_million_requests() -> None:
    costs = [Decimal("0.000013"), Decimal("0.000013"), Decimal("0.000026"), Decimal("0")]
    figures = candidate_figures(
        costs=costs,
        scores=[Decimal("1"), Decimal("1"), Decimal("0"), Decimal("0")],
        latencies_ms=[10.0, 20.0, 30.0],
        succeeded=3,
    )
    assert figures.cost_total == Decimal("0.000052") == sum(costs)
    assert figures.cost_per_request == Decimal("0.000013000")
    assert figures.cost_per_1m_requests == Decimal("13.000000")
    assert figures.quality_mean == Decimal("0.5000") and figures.quality_ci is not None
    assert (figures.requests, figures.succeeded) == (4, 3)
    assert figures.latency_p50_ms == 20.0 and figures.latency_p95_ms == pytest.approx(29.0)
    assert figures.latency_p95_ci_ms is not None


def test_paired_figures_compare_on_the_shared_requests_only() -> None:
    baseline = {
        1: (Decimal("0.02"), Decimal("1")),
        2: (Decimal("0.02"), Decimal("1")),
        3: (Decimal("0.02"), Decimal("0")),
    }
    candidate = {
        1: (Decimal("0.01"), Decimal("1")),
        2: (Decimal("0.01"), Decimal("0")),
        4: (Decimal("0.5"), Decimal("1")),
    }
    paired = paired_figures(candidate=candidate, baseline=baseline)
    assert paired.pairs == 2
    assert paired.cost_delta == Decimal("-0.010000000") and paired.cost_delta_ci == Decimal("0E-9")
    assert paired.quality_delta == Decimal("-0.5000")
