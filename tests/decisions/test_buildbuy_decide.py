"""Which API a version is judged against, the break-even it yields, and the stop rule
(decisions.buildbuy.decide), with exact Decimal answers."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from decisions.buildbuy.decide import ApiFigure, stop_reason, workflow_decision

D = Decimal
CHEAP = ApiFigure(slug="cheap", quality=D("0.5"), per_1m=D("1.6"))
DEAR = ApiFigure(slug="dear", quality=D("0.8"), per_1m=D("16"))
# Quality +0.2 per tenfold spend: 0.5 is reached at 10^1.5, 0.8 at 1000.
POINTS = [(D(1), D("0.2")), (D(10), D("0.4")), (D(100), D("0.6"))]


def _option(**overrides: Any) -> dict[str, Any]:
    return {
        "workflows": ["wf"],
        "volume_tokens_per_month": 10_000_000,
        "horizon_months": 10,
        "target_quality": None,
        "stop_when_buying_cheaper": False,
        **overrides,
    }


ONE = D("1")


def _decide(option: dict[str, Any], *, hosting: Decimal | None = ONE, quality: str = "0.6") -> Any:
    return workflow_decision(
        workflow="wf",
        option=option,
        apis=[CHEAP, DEAR],
        points=POINTS,
        newest_quality=D(quality),
        newest_cost=D(100),
        hosting_per_1m=hosting,
    )


def test_against_the_best_api_the_training_cost_is_the_forecast_to_reach_it() -> None:
    decision = _decide(_option())
    assert decision.compared == DEAR and decision.forecast_best is not None
    assert decision.forecast_best.cost == D("1000.00")
    assert decision.training_cost_basis == "forecast to reach 0.8"
    # 1000 over 10 months = 100 a month, over a margin of 15 per 1M: 6.67M tokens a month.
    assert decision.break_even_tokens_per_month == 6_666_667
    # At 10M tokens a month: owning 10 + 100, buying 160.
    assert (decision.own_monthly, decision.buy_monthly, decision.buying_cheaper) == (
        D("110.00"),
        D("160.00"),
        False,
    )
    assert decision.met == "" and decision.cheaper == ""


def test_the_cheapest_api_target_is_met_when_a_version_reached_its_quality() -> None:
    decision = _decide(_option(target_quality="cheapest_api"))
    assert decision.compared == CHEAP and decision.target == D("0.5")
    assert decision.met == "wf 0.6 >= 0.5 (cheapest_api cheap)"
    # Reached by the version that cost 100: 10 a month, margin 0.6 per 1M → 16.67M tokens.
    assert decision.training_cost_basis == "spent when 0.5 was reached"
    assert decision.break_even_tokens_per_month == 16_666_667
    assert stop_reason(option=_option(target_quality="cheapest_api"), decisions=[decision], newest="m@3") == (
        "build_or_buy target_quality cheapest_api met by m@3: wf 0.6 >= 0.5 (cheapest_api cheap)"
    )


def test_a_number_target_is_compared_with_the_cheapest_api_that_reaches_it() -> None:
    decision = _decide(_option(target_quality="0.7"), quality="0.6")
    assert decision.compared == DEAR and decision.met == ""
    assert _decide(_option(target_quality="0.4")).compared == CHEAP


def test_buying_cheaper_stops_the_run_only_when_the_option_asks() -> None:
    # Hosting at 15 per 1M against 16: owning 150 + 100 a month, buying 160.
    decision = _decide(_option(), hosting=D("15"))
    assert decision.buying_cheaper is True
    assert decision.cheaper == (
        "wf: buying dear costs 160.00/month at 10000000 tokens/month, owning 250.00/month "
        "(hosting 15/1M + training 1000.00 over 10 months)"
    )
    assert stop_reason(option=_option(), decisions=[decision], newest="m@3") == ""
    assert stop_reason(option=_option(stop_when_buying_cheaper=True), decisions=[decision], newest="m@3") == (
        f"build_or_buy stop_when_buying_cheaper after m@3: {decision.cheaper}"
    )


def test_hosting_dearer_than_the_api_has_no_break_even_and_no_hosting_figure_says_why() -> None:
    dearer = _decide(_option(), hosting=D("20"))
    assert dearer.break_even_tokens_per_month is None
    assert dearer.break_even_reason == "hosting 20/1M is not below dear's 16/1M: owning never wins"
    unhosted = _decide(_option(), hosting=None)
    assert unhosted.break_even_tokens_per_month is None and "serve_cluster" in unhosted.break_even_reason


def test_without_a_forecast_neither_buying_is_claimed_cheaper_nor_a_break_even_given() -> None:
    decision = workflow_decision(
        workflow="wf",
        option=_option(stop_when_buying_cheaper=True),
        apis=[DEAR],
        points=[(D(1), D("0.2"))],
        newest_quality=D("0.2"),
        newest_cost=D(1),
        hosting_per_1m=D("15"),
    )
    assert decision.buying_cheaper is None and decision.cheaper == ""
    # The spend so far would price a model worse than the API: no break-even, and why.
    assert decision.break_even_tokens_per_month is None and decision.own_monthly is None
    assert decision.break_even_reason.startswith("no version has reached dear's quality")
    assert "not forecastable: 1 scored version(s)" in decision.break_even_reason
