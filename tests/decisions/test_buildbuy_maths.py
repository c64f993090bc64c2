"""The build-or-buy arithmetic (decisions.buildbuy.maths), with exact Decimal answers."""

from __future__ import annotations

from decimal import Decimal

from billing.amortisation import amortised_per_1m
from decisions.buildbuy import maths as m

D = Decimal


def test_quality_linear_in_log_cost_gives_the_cost_of_a_target_exactly() -> None:
    # q = 0.2 + (0.2 / ln 10) · ln c: +0.2 per tenfold spend, so 0.8 is reached at 1000.
    points = [(D(1), D("0.2")), (D(10), D("0.4")), (D(100), D("0.6"))]
    forecast = m.forecast_cost_to_reach(points, D("0.8"))
    assert forecast.cost == D("1000.00") and forecast.reason == "" and forecast.points == 3
    assert forecast.fit is not None and forecast.fit.intercept.quantize(D("0.0001")) == D("0.2000")
    # Every resample of collinear points refits the same line (or none): a zero-width interval.
    assert (forecast.low, forecast.high) == (D("1000.00"), D("1000.00"))


def test_the_bootstrap_interval_brackets_the_forecast_of_noisy_points() -> None:
    points = [(D(1), D("0.20")), (D(10), D("0.45")), (D(100), D("0.55")), (D(1000), D("0.85"))]
    forecast = m.forecast_cost_to_reach(points, D("0.95"))
    assert forecast.cost is not None and forecast.low is not None and forecast.high is not None
    assert forecast.low <= forecast.cost <= forecast.high
    assert forecast.low < forecast.high
    # Deterministic: the same points give the same interval on every page view.
    assert m.forecast_cost_to_reach(points, D("0.95")) == forecast


def test_too_few_points_or_a_flat_curve_is_not_forecastable_with_its_reason() -> None:
    two = m.forecast_cost_to_reach([(D(1), D("0.1")), (D(2), D("0.2"))], D("0.9"))
    assert two.cost is None and "at least 3" in two.reason
    flat = m.forecast_cost_to_reach([(D(1), D("0.3")), (D(2), D("0.3")), (D(4), D("0.2"))], D("0.9"))
    assert flat.cost is None and "does not rise" in flat.reason


def test_a_target_already_met_costs_the_spend_of_the_first_version_that_met_it() -> None:
    points = [(D("1.5"), D("0.4")), (D("3.25"), D("0.7")), (D("5"), D("0.8"))]
    forecast = m.forecast_cost_to_reach(points, D("0.7"))
    assert forecast.already_met and forecast.cost == D("3.25")


def test_amortised_per_1m_adds_the_training_cost_spread_over_the_horizon_volume() -> None:
    # 120 over 12 months = 10 a month, over 5M tokens a month = 2 per 1M, on top of 0.5 hosting.
    figure = amortised_per_1m(
        hosting_per_1m=D("0.5"), training_cost=D("120"), horizon_months=12, volume_tokens_per_month=5_000_000
    )
    assert figure == D("2.500000")
    assert m.monthly_own(
        hosting_per_1m=D("0.5"), training_cost=D("120"), horizon_months=12, volume_tokens_per_month=5_000_000
    ) == D("12.50")
    assert m.monthly_buy(api_per_1m=D("3"), volume_tokens_per_month=5_000_000) == D("15.00")


def test_break_even_is_where_owning_becomes_strictly_cheaper_and_none_when_hosting_costs_more() -> None:
    # 10 a month of training over a margin of 2.5 per 1M: equal at 4M tokens, cheaper above.
    assert (
        m.break_even_tokens_per_month(
            hosting_per_1m=D("0.5"), api_per_1m=D("3"), training_cost=D("120"), horizon_months=12
        )
        == 4_000_001
    )
    # A non-integer point rounds up: 1e6 · 10 / 3 = 3333333.33…
    assert (
        m.break_even_tokens_per_month(
            hosting_per_1m=D("1"), api_per_1m=D("4"), training_cost=D("120"), horizon_months=12
        )
        == 3_333_334
    )
    assert (
        m.break_even_tokens_per_month(
            hosting_per_1m=D("3"), api_per_1m=D("3"), training_cost=D("1"), horizon_months=1
        )
        is None
    )


def test_api_prices_blend_by_the_token_mix_and_hosting_divides_by_tokens_served() -> None:
    assert m.blended_per_1m(input_per_1m=D("1"), output_per_1m=D("3"), tokens_in=300, tokens_out=100) == D(
        "1.500000"
    )
    assert m.blended_per_1m(input_per_1m=D("1"), output_per_1m=D("3"), tokens_in=0, tokens_out=0) is None
    # 0.002 of accelerator time for 4000 tokens: 0.5 per 1M.
    assert m.hosting_per_1m(hosting_cost=D("0.002"), tokens=4000) == D("0.500000")
    assert m.hosting_per_1m(hosting_cost=D("0.002"), tokens=0) is None
