"""The figures of a replay candidate, from its per-request results: pure functions, no Django.

- Means with a 95% confidence half-width from Student's t distribution with n-1 degrees of
  freedom (mean ± t·s/√n; Student 1908, any statistics text: e.g. Wasserman, "All of
  Statistics", §6.3.2). For the 100-request replays this is within 1% of the normal
  approximation (t = 1.984 against z = 1.960), and it stays honest for small samples.
  Money stays Decimal throughout: the mean of ledger amounts, its half-width from a Decimal
  square root.
- Percentiles by linear interpolation between order statistics (Hyndman & Fan 1996, definition 7,
  numpy's default), so p50/p95 match what the latency pages show.
- The p95's 95% interval by the percentile bootstrap (Efron & Tibshirani 1993, ch. 13): resample
  the latencies with replacement B times, take each resample's p95, and report half the width
  between the 2.5th and 97.5th percentiles of those. Seeded, so a study's figures never change
  when they are computed again.
- Paired differences (candidate − baseline on the same kept requests) with the same t interval:
  the request-to-request variation cancels, so a real difference shows with fewer requests.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from statistics import NormalDist

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 20260501
MILLION = Decimal(1_000_000)
MONEY_PLACES = Decimal("0.000000001")  # 9 places, as the ledger's amounts
PER_1M_PLACES = Decimal("0.000001")
SCORE_PLACES = Decimal("0.0001")

# Two-sided 97.5% quantiles of Student's t for 1..10 degrees of freedom (the expansion below
# is off by more than 0.001 there).
_T975 = {
    1: 12.706205,
    2: 4.302653,
    3: 3.182446,
    4: 2.776445,
    5: 2.570582,
    6: 2.446912,
    7: 2.364624,
    8: 2.306004,
    9: 2.262157,
    10: 2.228139,
}


def t_quantile_975(df: int) -> float:
    """Student's t 0.975 quantile: a table to 10 degrees of freedom, then the Cornish-Fisher
    expansion in the normal quantile (Abramowitz & Stegun 26.7.5), within 1e-4 from there."""
    if df < 1:
        raise ValueError("degrees of freedom must be at least 1")
    if df in _T975:
        return _T975[df]
    z = NormalDist().inv_cdf(0.975)
    v = float(df)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4)
    )


@dataclass(frozen=True)
class MeanCI:
    mean: Decimal
    half_width: Decimal | None  # None with fewer than two values
    n: int


def mean_ci(values: Sequence[Decimal]) -> MeanCI | None:
    """The mean and its 95% t half-width, in Decimal (None for no values)."""
    n = len(values)
    if n == 0:
        return None
    total = sum(values, Decimal(0))
    mean = total / n
    if n < 2:
        return MeanCI(mean, None, n)
    variance = sum(((v - mean) ** 2 for v in values), Decimal(0)) / (n - 1)
    half = Decimal(repr(t_quantile_975(n - 1))) * (variance / n).sqrt()
    return MeanCI(mean, half, n)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between order statistics (Hyndman & Fan type 7)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def bootstrap_half_width(
    values: Sequence[float],
    q: float,
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> float | None:
    """Half the width of the percentile-bootstrap 95% interval of the q-th percentile."""
    n = len(values)
    if n < 2:
        return None
    rng = random.Random(seed)  # noqa: S311 (statistics, not secrets)
    data = list(values)
    stats = sorted(percentile(rng.choices(data, k=n), q) for _ in range(resamples))
    alpha = (1 - CONFIDENCE) / 2 * 100
    return (percentile(stats, 100 - alpha) - percentile(stats, alpha)) / 2


@dataclass(frozen=True)
class CandidateFigures:
    requests: int
    succeeded: int
    cost_total: Decimal
    cost_per_request: Decimal | None
    cost_per_request_ci: Decimal | None
    cost_per_1m_requests: Decimal | None
    quality_mean: Decimal | None
    quality_ci: Decimal | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p95_ci_ms: float | None


def _q(value: Decimal | None, places: Decimal) -> Decimal | None:
    return value.quantize(places) if value is not None else None


def candidate_figures(
    *, costs: Sequence[Decimal], scores: Sequence[Decimal], latencies_ms: Sequence[float], succeeded: int
) -> CandidateFigures:
    """A candidate's figures: `costs` one ledger amount per replayed request (0 for a refused
    one), `scores` one per replayed request (0 for one not answered), `latencies_ms` those of
    the answered requests."""
    cost = mean_ci(costs)
    quality = mean_ci(scores)
    p95 = percentile(latencies_ms, 95) if latencies_ms else None
    return CandidateFigures(
        requests=len(costs),
        succeeded=succeeded,
        cost_total=sum(costs, Decimal(0)),
        cost_per_request=_q(cost.mean, MONEY_PLACES) if cost else None,
        cost_per_request_ci=_q(cost.half_width, MONEY_PLACES) if cost else None,
        # From the exact mean, not the rounded one: a million requests magnify the rounding.
        cost_per_1m_requests=_q(cost.mean * MILLION, PER_1M_PLACES) if cost else None,
        quality_mean=_q(quality.mean, SCORE_PLACES) if quality else None,
        quality_ci=_q(quality.half_width, SCORE_PLACES) if quality else None,
        latency_p50_ms=percentile(latencies_ms, 50) if latencies_ms else None,
        latency_p95_ms=p95,
        latency_p95_ci_ms=bootstrap_half_width(latencies_ms, 95) if latencies_ms else None,
    )


@dataclass(frozen=True)
class PairedFigures:
    pairs: int
    cost_delta: Decimal | None
    cost_delta_ci: Decimal | None
    quality_delta: Decimal | None
    quality_delta_ci: Decimal | None


def paired_figures(
    *, candidate: dict[int, tuple[Decimal, Decimal]], baseline: dict[int, tuple[Decimal, Decimal]]
) -> PairedFigures:
    """Candidate − baseline over the kept requests both replayed: {request id: (cost, score)}."""
    shared = sorted(set(candidate) & set(baseline))
    cost = mean_ci([candidate[r][0] - baseline[r][0] for r in shared])
    quality = mean_ci([candidate[r][1] - baseline[r][1] for r in shared])
    return PairedFigures(
        pairs=len(shared),
        cost_delta=_q(cost.mean, MONEY_PLACES) if cost else None,
        cost_delta_ci=_q(cost.half_width, MONEY_PLACES) if cost else None,
        quality_delta=_q(quality.mean, SCORE_PLACES) if quality else None,
        quality_delta_ci=_q(quality.half_width, SCORE_PLACES) if quality else None,
    )
