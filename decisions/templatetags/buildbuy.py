"""{% build_or_buy_panel run %}: the build-or-buy panel on the run page.

The run page belongs to training, which may not import this app; the template loads this tag
library instead, so the arrow points from the composition app down to training."""

from __future__ import annotations

from typing import Any

from django import template

from decisions.buildbuy.charts import build_or_buy_figure
from decisions.buildbuy.selectors import build_or_buy_report
from registry.auth.principal import can_see_costs

register = template.Library()


@register.inclusion_tag("decisions/build_or_buy_panel.html", takes_context=True)
def build_or_buy_panel(context: dict[str, Any], run: Any) -> dict[str, Any]:
    request = context.get("request")
    user = getattr(request, "user", None)
    option = (run.config or {}).get("build_or_buy")
    if not option or user is None or not can_see_costs(user, run.team_id):
        return {"shown": False}
    report = build_or_buy_report(run=run)
    return {"shown": True, "report": report, "figure": build_or_buy_figure(report)}
