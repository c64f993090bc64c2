"""Who sees money, applied the same way on pages, API answers, charts and the gateway's headers.

The rule is registry.auth.principal's `Principal.sees_costs(team)`: a team's auditors, operators
and admins (the ledger's readers) see the money of that team's objects; its viewers see none (no
cost, price, spend, budget or money limit, not even inside a chart or a sentence), whatever role
they hold in another team. Where it is applied:

- API answers: CostAwareJSONRenderer (REST_FRAMEWORK's renderer) drops the MONEY_KEYS, nested
  ones included, from every object whose team's money the caller may not see (by the view's
  own team rule); views that answer JSON themselves call `money_for(request, data, team_id)`.
- Pages: the `can_see_costs` template variable (`cost_visibility`, a context processor); views
  do not compute money for a viewer in the first place (charts of money, totals, ledger rows),
  and text that would quote a figure is built without it.
- /v1: inference.gateway.views sends `x-switchyard-cost` (and the stream's cost) only to a key that may
  see the money of the workflow's team.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.http import HttpRequest
from rest_framework.renderers import JSONRenderer

from registry.auth.principal import can_see_costs, principal_of, sees_any_costs
from registry.auth.scoping import team_scope_queryset, view_team_rule

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


# A key naming any of these is money too, whatever its full name (`cost_total`,
# `cost_per_request_before`, `ledger_amount_after`, `hosting_cost`, `token_prices`...): a field
# added later that carries money is hidden from viewers without a line here (fail closed).
MONEY_KEY_PARTS = ("cost", "price", "spend", "amount", "budget", "saving", "money", "projected")


def is_money_key(key: object) -> bool:
    if not isinstance(key, str):
        return False
    lowered = key.lower()
    return key in MONEY_KEYS or any(part in lowered for part in MONEY_KEY_PARTS)


def without_money(data: Any) -> Any:
    """`data` (JSON-like: dicts, lists, scalars) less every money entry (MONEY_KEYS, or a key
    naming one of MONEY_KEY_PARTS), at any depth."""
    if isinstance(data, Mapping):
        return {key: without_money(value) for key, value in data.items() if not is_money_key(key)}
    if isinstance(data, list | tuple):
        return [without_money(item) for item in data]
    return data


def money_for(who: Any, data: Any, team_id: int | None) -> Any:
    """`data`, an object of team `team_id`, as `who` (a user or a request) may see it."""
    return data if can_see_costs(who, team_id) else without_money(data)


def _lookup(view: Any) -> tuple[str, Any] | None:
    """The lookup (field, value) of a detail view's object; None for a list."""
    kwargs = getattr(view, "kwargs", None) or {}
    url_kwarg = getattr(view, "lookup_url_kwarg", None) or getattr(view, "lookup_field", "pk")
    if url_kwarg not in kwargs:
        return None
    return getattr(view, "lookup_field", "pk"), kwargs[url_kwarg]


def _rows(data: Any) -> list[Any] | None:
    if isinstance(data, list):
        return data
    if isinstance(data, Mapping) and isinstance(data.get("results"), list):
        return data["results"]  # type: ignore[no-any-return]
    return None


def _money_by_team(data: Any, request: Any, view: Any) -> Any:
    """`data` with money kept only where it belongs to a team whose money the caller sees: the
    object of a detail answer, each row of a list, by the view's own team rule
    (registry.auth.scoping); anything whose team cannot be told loses its money."""
    principal = principal_of(request)
    get_queryset = getattr(view, "get_queryset", None)
    if get_queryset is None or view_team_rule(view) is None:
        return without_money(data)
    if view_team_rule(view) == "shared":  # price lists: every ledger reader's
        return data if principal.sees_any_costs else without_money(data)
    model = get_queryset().model
    visible = team_scope_queryset(model._default_manager.all(), request, view, teams=principal.cost_teams)
    lookup = _lookup(view)
    if lookup is not None:
        field, value = lookup
        try:
            shows = visible.filter(**{field: value}).exists()
        except (ValueError, TypeError):
            shows = False
        return data if shows else without_money(data)
    rows = _rows(data)
    if rows is None:
        return without_money(data)
    field = getattr(view, "lookup_field", "pk")
    key = "id" if field == "pk" else field
    values = [row.get(key) for row in rows if isinstance(row, Mapping)]
    shown = set(
        visible.filter(**{f"{field}__in": [v for v in values if v is not None]}).values_list(field, flat=True)
    )
    kept = [row if isinstance(row, Mapping) and row.get(key) in shown else without_money(row) for row in rows]
    if isinstance(data, list):
        return kept
    return {**without_money({k: v for k, v in data.items() if k != "results"}), "results": kept}


def money_in_answer(data: Any, request: Any, view: Any) -> Any:
    """An API answer as its caller may see it: whole for one who sees the money of every team
    it reads, none for one who sees no money, per object's team otherwise."""
    principal = principal_of(request)
    if principal.sees_costs_of_every_visible_team():
        return data
    if not principal.sees_any_costs:
        return without_money(data)
    return _money_by_team(data, request, view)


class CostAwareJSONRenderer(JSONRenderer):
    """JSON, less the money figures of the teams whose money the caller may not see."""

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        context = renderer_context or {}
        request = context.get("request")
        response = context.get("response")
        if request is None:
            data = without_money(data)
        elif response is None or response.status_code < 400:
            data = money_in_answer(data, request, context.get("view"))
        return super().render(data, accepted_media_type, renderer_context)


def cost_visibility(request: HttpRequest) -> dict[str, bool]:
    """Template context processor: `can_see_costs`, whether the page's user sees money in some
    team (the money menus). A page about one team's object sets it for that team (its view puts
    `can_see_costs` in its own context, which wins)."""
    return {"can_see_costs": sees_any_costs(request)}
