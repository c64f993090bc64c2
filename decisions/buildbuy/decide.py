"""Build or buy, the decision per workflow and the stop rule: pure functions of the figures the
report gathers (no Django), so each rule is tested with exact Decimals.

Which API a workflow's version is judged against: the cheapest (by $/1M in the eval's token
mix) for target "cheapest_api"; the best (highest measured quality) for "best_api"; for a number,
the cheapest API whose quality reaches it (the best when none does); with no target, the best.

The training cost a break-even is computed with is that of a model as good as the compared API:
the money spent when a version first reached its quality, else the forecast cost to reach it
(decisions.buildbuy.maths); with neither there is no break-even (the spend so far would
price a model that is not as good as the API). "Buying is cheaper" is likewise only claimed on a
forecast or a reached quality.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from decisions.buildbuy import maths


@dataclass(frozen=True)
class ApiFigure:
    slug: str
    quality: Decimal
    per_1m: Decimal | None


@dataclass
class WorkflowDecision:
    workflow: str
    best: ApiFigure | None
    compared: ApiFigure | None
    target: Decimal | None
    target_name: str
    forecast_best: maths.Forecast | None
    met: str = ""  # why the target is met by the newest version ("" when not)
    break_even_tokens_per_month: int | None = None
    break_even_reason: str = ""
    training_cost_basis: str = ""
    own_monthly: Decimal | None = None
    buy_monthly: Decimal | None = None
    buying_cheaper: bool | None = None
    cheaper: str = field(default="")  # why buying is cheaper ("" when it is not, or unknown)


def _compare(
    spec: Any, apis: Sequence[ApiFigure]
) -> tuple[Decimal | None, str, ApiFigure | None, ApiFigure | None]:
    priced = [a for a in apis if a.per_1m is not None]
    best = max(apis, key=lambda a: (a.quality, -(a.per_1m or Decimal(0)), a.slug), default=None)
    cheapest = min(priced, key=lambda a: (a.per_1m, -a.quality, a.slug), default=None)
    if spec == "cheapest_api":
        return (cheapest.quality if cheapest else None), "cheapest_api", cheapest, best
    if spec == "best_api":
        return (best.quality if best else None), "best_api", best, best
    if spec is not None:
        value = Decimal(str(spec))
        reaching = [a for a in priced if a.quality >= value]
        compared = min(reaching, key=lambda a: (a.per_1m, a.slug), default=best)
        return value, str(value), compared, best
    return None, "", best, best


def workflow_decision(
    *,
    workflow: str,
    option: dict[str, Any],
    apis: Sequence[ApiFigure],
    points: Sequence[tuple[Decimal, Decimal]],
    newest_quality: Decimal | None,
    newest_cost: Decimal,
    hosting_per_1m: Decimal | None,
) -> WorkflowDecision:
    """`points`: (money spent, quality) of each scored version; `newest_*`: the newest scored
    version's quality on this workflow and its training cost; `hosting_per_1m`: its self-hosted
    price (None without a serve cluster)."""
    volume, horizon = int(option["volume_tokens_per_month"]), int(option["horizon_months"])
    target, target_name, compared, best = _compare(option.get("target_quality"), apis)
    decision = WorkflowDecision(
        workflow=workflow,
        best=best,
        compared=compared,
        target=target,
        target_name=target_name,
        forecast_best=maths.forecast_cost_to_reach(points, best.quality) if best else None,
    )
    if target is not None and newest_quality is not None and newest_quality >= target:
        named = f" ({target_name} {compared.slug})" if target_name.endswith("_api") and compared else ""
        decision.met = f"{workflow} {newest_quality} >= {target}{named}"
    if compared is None or compared.per_1m is None:
        decision.break_even_reason = "no priced API deployment scored on this workflow's eval sets"
        return decision
    if hosting_per_1m is None:
        decision.break_even_reason = "no self-hosted figure yet (a scored version served on serve_cluster)"
        return decision
    reach = maths.forecast_cost_to_reach(points, compared.quality)
    if reach.cost is None:
        # Owning only beats buying with a model as good as the API: with that quality neither
        # reached nor forecastable there is no training cost to set against the API's price,
        # and the spend so far would price a model that is not as good.
        decision.break_even_reason = (
            f"no version has reached {compared.slug}'s quality {compared.quality} and the curve "
            f"cannot say what it would cost ({reach.reason})"
        )
        return decision
    basis = reach.cost
    decision.training_cost_basis = (
        f"spent when {compared.quality} was reached"
        if reach.already_met
        else f"forecast to reach {compared.quality}"
    )
    decision.break_even_tokens_per_month = maths.break_even_tokens_per_month(
        hosting_per_1m=hosting_per_1m, api_per_1m=compared.per_1m, training_cost=basis, horizon_months=horizon
    )
    if decision.break_even_tokens_per_month is None:
        decision.break_even_reason = f"hosting {hosting_per_1m}/1M is not below {compared.slug}'s {compared.per_1m}/1M: owning never wins"
    own = maths.monthly_own(
        hosting_per_1m=hosting_per_1m,
        training_cost=basis,
        horizon_months=horizon,
        volume_tokens_per_month=volume,
    )
    buy = maths.monthly_buy(api_per_1m=compared.per_1m, volume_tokens_per_month=volume)
    decision.own_monthly, decision.buy_monthly = own, buy
    decision.buying_cheaper = buy < own
    if decision.buying_cheaper:
        decision.cheaper = (
            f"{workflow}: buying {compared.slug} costs {buy}/month at {volume} tokens/month, owning {own}/month "
            f"(hosting {hosting_per_1m}/1M + training {basis} over {horizon} months)"
        )
    return decision


def stop_reason(*, option: dict[str, Any], decisions: Sequence[WorkflowDecision], newest: str | None) -> str:
    """Why the run should stop after its newest scored version ("" when it should go on): its
    target quality met on every workflow, or, with stop_when_buying_cheaper, buying cheaper at
    the forecast volume on every workflow."""
    if newest is None or not decisions:
        return ""
    if option.get("target_quality") is not None and all(d.met for d in decisions):
        return f"build_or_buy target_quality {option['target_quality']} met by {newest}: " + "; ".join(
            d.met for d in decisions
        )
    if option.get("stop_when_buying_cheaper") and all(d.cheaper for d in decisions):
        return f"build_or_buy stop_when_buying_cheaper after {newest}: " + "; ".join(
            d.cheaper for d in decisions
        )
    return ""
