"""Build or buy, the arithmetic: pure functions of Decimals (no Django, no database).

Quality against money. Scaling laws find a model's loss falling as a power law in the compute
spent on it (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", arXiv 2001.08361),
so each doubling of spend buys a roughly constant step: quality is fitted as linear in ln(cost),

    q = a + b · ln(c)        (ordinary least squares over the run's scored versions)

and the cost to reach a target quality q* is c* = exp((q* − a) / b). That is only a forecast
when the slope is positive and there are at least MIN_POINTS versions with distinct costs; its
uncertainty is a percentile bootstrap (resample the points with replacement, refit, take the
10th and 90th percentiles of c*: an 80% interval), with a fixed seed so a page shows the same
interval every time it is drawn.

Owning against buying, per month at V tokens a month (volumes in tokens, prices per 1M):

    own(V) = hosting_per_1m · V / 1e6 + training_cost / horizon_months
    buy(V) = api_per_1m · V / 1e6

Owning wins above the break-even V* = 1e6 · (training_cost / horizon) / (api − hosting); there
is none when hosting per 1M is not below the API's price. The amortised per-1M figure puts the
training cost into the serving price: hosting_per_1m + (training_cost / horizon) / (V / 1e6).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_HALF_EVEN, Decimal, localcontext

# The amortised figure is billing's (one formula for versions and for deployed models).

MILLION = Decimal(1_000_000)
MIN_POINTS = 3
BOOTSTRAP_RESAMPLES = 200
BOOTSTRAP_SEED = 20012001  # fixed: the interval is part of a page, not a random draw per view
INTERVAL = (Decimal("0.10"), Decimal("0.90"))  # percentile bootstrap: an 80% interval
MONEY = Decimal("0.01")
PER_1M = Decimal("0.000001")
QUALITY = Decimal("0.0001")
# A forecast beyond this many times the spend so far is reported as out of reach, not a number.
MAX_EXTRAPOLATION = Decimal(1_000_000)


@dataclass(frozen=True)
class Fit:
    intercept: Decimal  # a
    slope: Decimal  # b: quality gained per e-fold of spend


@dataclass(frozen=True)
class Forecast:
    """Cost to reach `target` quality, or why it cannot be said (`cost` None, `reason` set)."""

    target: Decimal
    cost: Decimal | None = None
    low: Decimal | None = None
    high: Decimal | None = None
    fit: Fit | None = None
    points: int = 0
    reason: str = ""
    already_met: bool = False


def fit_log_linear(points: Sequence[tuple[Decimal, Decimal]]) -> Fit | None:
    """OLS of quality on ln(cost) over (cost, quality) points with cost > 0; None when the costs
    are not at least two distinct positive values."""
    usable = [(c, q) for c, q in points if c > 0]
    with localcontext() as ctx:
        ctx.prec = 40
        xs = [c.ln() for c, _ in usable]
        ys = [q for _, q in usable]
        n = Decimal(len(xs))
        if len(set(xs)) < 2:
            return None
        mx = sum(xs, Decimal(0)) / n
        my = sum(ys, Decimal(0)) / n
        sxx = sum(((x - mx) ** 2 for x in xs), Decimal(0))
        sxy = sum(((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)), Decimal(0))
        slope = sxy / sxx
        return Fit(intercept=+(my - slope * mx), slope=+slope)


def _cost_at(fit: Fit, target: Decimal) -> Decimal | None:
    if fit.slope <= 0:
        return None
    with localcontext() as ctx:
        ctx.prec = 40
        exponent = (target - fit.intercept) / fit.slope
        if exponent > 500:  # e^500: beyond any budget, and beyond what Decimal needs to show
            return None
        return +exponent.exp()


def forecast_cost_to_reach(
    points: Sequence[tuple[Decimal, Decimal]],
    target: Decimal,
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> Forecast:
    """The money (total spent on the run) at which the fitted curve reaches `target`, with a
    percentile-bootstrap interval; or the reason it is not forecastable."""
    usable = [(c, q) for c, q in points if c > 0]
    best = max((q for _, q in usable), default=None)
    if best is not None and best >= target:
        spent = min(c for c, q in usable if q >= target)
        return Forecast(target=target, cost=spent.quantize(MONEY), points=len(usable), already_met=True)
    if len({c for c, _ in usable}) < MIN_POINTS:
        return Forecast(
            target=target,
            points=len(usable),
            reason=f"not forecastable: {len(usable)} scored version(s) with distinct costs; "
            f"the fit needs at least {MIN_POINTS}",
        )
    fit = fit_log_linear(usable)
    assert fit is not None  # noqa: S101 (three distinct costs: the fit exists)
    cost = _cost_at(fit, target)
    spent = max(c for c, _ in usable)
    if cost is None:
        return Forecast(
            target=target,
            fit=fit,
            points=len(usable),
            reason=f"not forecastable: quality does not rise with spend (slope {fit.slope.quantize(QUALITY)} "
            "per e-fold of cost)",
        )
    if cost > spent * MAX_EXTRAPOLATION:
        return Forecast(
            target=target,
            fit=fit,
            points=len(usable),
            reason=f"not forecastable: the trend reaches {target} only beyond {MAX_EXTRAPOLATION}x the spend so far",
        )
    rng = random.Random(seed)  # noqa: S311 (a bootstrap, not a secret)
    draws: list[Decimal] = []
    for _ in range(resamples):
        sample = [usable[rng.randrange(len(usable))] for _ in usable]
        refit = fit_log_linear(sample)
        at = _cost_at(refit, target) if refit is not None else None
        if at is not None:
            draws.append(at)
    low = high = None
    if draws:
        draws.sort()
        low = _percentile(draws, INTERVAL[0]).quantize(MONEY)
        high = _percentile(draws, INTERVAL[1]).quantize(MONEY)
    return Forecast(
        target=target,
        cost=cost.quantize(MONEY, rounding=ROUND_HALF_EVEN),
        low=low,
        high=high,
        fit=fit,
        points=len(usable),
    )


def _percentile(sorted_values: Sequence[Decimal], p: Decimal) -> Decimal:
    """Nearest-rank percentile of an ascending list."""
    rank = int((p * len(sorted_values)).to_integral_value(rounding=ROUND_CEILING))
    return sorted_values[min(max(rank, 1), len(sorted_values)) - 1]


def monthly_own(
    *, hosting_per_1m: Decimal, training_cost: Decimal, horizon_months: int, volume_tokens_per_month: int
) -> Decimal:
    return (
        hosting_per_1m * Decimal(volume_tokens_per_month) / MILLION + training_cost / Decimal(horizon_months)
    ).quantize(MONEY)


def monthly_buy(*, api_per_1m: Decimal, volume_tokens_per_month: int) -> Decimal:
    return (api_per_1m * Decimal(volume_tokens_per_month) / MILLION).quantize(MONEY)


def break_even_tokens_per_month(
    *, hosting_per_1m: Decimal, api_per_1m: Decimal, training_cost: Decimal, horizon_months: int
) -> int | None:
    """The least whole number of tokens a month at which owning costs less than buying; None
    when hosting per 1M is not below the API's price (owning never catches up)."""
    margin = api_per_1m - hosting_per_1m
    if margin <= 0:
        return None
    with localcontext() as ctx:
        ctx.prec = 40
        exact = MILLION * training_cost / Decimal(horizon_months) / margin
        # Strictly cheaper: above the exact point.
        return int(exact.to_integral_value(rounding=ROUND_CEILING)) + (
            1 if exact == exact.to_integral_value() else 0
        )


def blended_per_1m(
    *, input_per_1m: Decimal, output_per_1m: Decimal, tokens_in: int, tokens_out: int
) -> Decimal | None:
    """A token price blended by a token mix (the eval's): what 1M tokens in that mix cost."""
    total = tokens_in + tokens_out
    if total <= 0:
        return None
    return ((input_per_1m * tokens_in + output_per_1m * tokens_out) / Decimal(total)).quantize(PER_1M)


def hosting_per_1m(*, hosting_cost: Decimal, tokens: int) -> Decimal | None:
    """Accelerator-time cost per 1M tokens served (price per hour / measured tokens per hour)."""
    if tokens <= 0:
        return None
    return (hosting_cost * MILLION / Decimal(tokens)).quantize(PER_1M)
