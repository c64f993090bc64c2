"""Who sees money, applied the same way on pages, API answers, charts and the gateway's headers.

The rule is stack.registry.roles.can_see_costs: auditors, operators and admins (the ledger's
readers) see every money figure; viewers see none (no cost, price, spend, budget or money
limit, not even inside a chart or a sentence). Where it is applied:

- API answers: CostAwareJSONRenderer (REST_FRAMEWORK's renderer) drops the MONEY_KEYS from every
  object of a viewer's answer, nested ones included; views that answer JSON themselves call
  `money_for(user, data)`.
- Pages: the `can_see_costs` template variable (`cost_visibility`, a context processor); views
  do not compute money for a viewer in the first place (charts of money, totals, ledger rows),
  and text that would quote a figure is built without it.
- /v1: inference.gateway sends `x-switchyard-cost` only to a token whose user may see costs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.http import HttpRequest
from rest_framework.renderers import JSONRenderer

from stack.registry.roles import can_see_costs

# Every key under which an answer carries a money figure. The billing endpoints that hold nothing
# else (ledger, prices, budgets, exports, reconciliation) are closed to viewers by their roles;
# these are the figures that also appear in answers every role may read.
MONEY_KEYS = frozenset(
    {
        "amount",  # a ledger amount (a run's cost per cluster)
        "cost",  # a request's, batch job's, eval run's or run's cost so far
        "cost_per_loss_improvement",
        "cost_per_million_tokens",
        "cost_so_far",  # per published version of a run
        "extra_cost",  # what a failover cost
        "limit_amount",
        "max_cost_per_request",  # a routing policy's money limit
        "money_budget",  # a training run's
        "price",  # a placement candidate's accelerator-hour price
        "spend",
        "training_cost",
        "unit_price",
    }
)


def without_money(data: Any) -> Any:
    """`data` (JSON-like: dicts, lists, scalars) less every MONEY_KEYS entry, at any depth."""
    if isinstance(data, Mapping):
        return {key: without_money(value) for key, value in data.items() if key not in MONEY_KEYS}
    if isinstance(data, list | tuple):
        return [without_money(item) for item in data]
    return data


def money_for(user: User | AnonymousUser, data: Any) -> Any:
    """`data` as `user` may see it."""
    return data if can_see_costs(user) else without_money(data)


class CostAwareJSONRenderer(JSONRenderer):
    """JSON, less the money figures when the caller may not see costs."""

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        request = (renderer_context or {}).get("request")
        user = getattr(request, "user", None)
        if user is None or not can_see_costs(user):
            data = without_money(data)
        return super().render(data, accepted_media_type, renderer_context)


def cost_visibility(request: HttpRequest) -> dict[str, bool]:
    """Template context processor: `can_see_costs` for the page's user."""
    user = getattr(request, "user", None)
    return {"can_see_costs": user is not None and can_see_costs(user)}
