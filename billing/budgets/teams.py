"""Which budgets belong to which teams (registry.auth.teams' rule, for the API and pages).

A workflow's budget belongs to the workflow's team, a team's budget to the team it names (by
slug, as the ledger does), a training run's budget to the run's team. Provider and cluster
budgets span every team's spend on shared infrastructure: they are the platform's, and a
team-scoped caller neither sees them (their figures hold other teams' spend) nor sets them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db.models import CharField, Q
from django.db.models.functions import Cast

from billing.models import Budget
from registry.auth.subjects import subject_rows_in_teams
from registry.auth.teams import team_slugs
from registry.validation import id_parse

PLATFORM_SCOPES = frozenset({Budget.Scope.PROVIDER, Budget.Scope.CLUSTER})
PLATFORM_SCOPE_MESSAGE = "provider and cluster budgets cover every team's spend: a platform admin sets them"


def budgets_of_teams(teams: frozenset[int], *, prefix: str = "") -> Q:
    """The condition for the budgets `teams` own; `prefix` is the lookup to the budget
    ("budget__" for its alerts)."""
    owned = Q(**{f"{prefix}scope": Budget.Scope.WORKFLOW, f"{prefix}workflow__team__in": teams}) | Q(
        **{f"{prefix}scope": Budget.Scope.TEAM, f"{prefix}team__in": sorted(team_slugs(teams) or ())}
    )
    runs = subject_rows_in_teams("training_run", teams)
    if runs is not None:
        # Budgets hold the run's id as text (as the ledger's subject_id does).
        run_ids = runs.annotate(id_text=Cast("pk", CharField())).values("id_text")
        owned |= Q(**{f"{prefix}scope": Budget.Scope.TRAINING_RUN, f"{prefix}training_run_id__in": run_ids})
    return owned


def budget_team_errors(*, values: Mapping[str, Any], teams: frozenset[int] | None) -> dict[str, list[str]]:
    """Field errors of a budget that a caller limited to `teams` (those it may write in; None:
    every team) may not set: another team's target reads as one that does not exist. The
    workflow itself is checked by the serializer's scoped field."""
    if teams is None:
        return {}
    scope = values.get("scope")
    if scope in PLATFORM_SCOPES:
        return {"scope": [PLATFORM_SCOPE_MESSAGE]}
    if scope == Budget.Scope.TEAM:
        team = values.get("team") or ""
        if team and team not in (team_slugs(teams) or ()):
            return {"team": [f"no team {team}"]}
    if scope == Budget.Scope.TRAINING_RUN:
        run_id = id_parse(str(values.get("training_run_id") or ""))
        runs = subject_rows_in_teams("training_run", teams)
        if run_id is not None and (runs is None or not runs.filter(pk=run_id).exists()):
            return {"training_run_id": [f"no training run #{run_id}"]}
    return {}
