"""Which ids name real things, and which team owns them, for apps below the app that owns them.

The ledger and budgets name work by (subject_type, subject_id): a budget on a training run holds
the run's id, but billing may not import training (docs/architecture.md, "Import layers"). The app that owns
a kind registers how to tell whether an id exists and which of its rows belong to some teams
(training does in TrainingConfig.ready), and billing and the registry ask here: a budget on a
run that does not exist is refused instead of never counting anything, and a team sees the
budgets and failover events of its own runs only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import QuerySet

_EXISTS: dict[str, Callable[[str], bool]] = {}
_IN_TEAMS: dict[str, Callable[[frozenset[int]], QuerySet[Any]]] = {}


def subject_kind_register(
    kind: str,
    *,
    exists: Callable[[str], bool],
    in_teams: Callable[[frozenset[int]], QuerySet[Any]] | None = None,
) -> None:
    """Register how to tell whether a `kind` with a given id exists and, with `in_teams`, which
    of its rows the given teams own (idempotent: the last wins)."""
    _EXISTS[kind] = exists
    if in_teams is not None:
        _IN_TEAMS[kind] = in_teams


def subject_exists(kind: str, subject_id: str) -> bool | None:
    """Whether the `kind` with this id exists; None when no installed app knows the kind."""
    exists = _EXISTS.get(kind)
    return None if exists is None else exists(subject_id)


def subject_rows_in_teams(kind: str, teams: frozenset[int]) -> QuerySet[Any] | None:
    """The rows of `kind` that `teams` own (a queryset of the owning app's model, for a
    subquery on its `pk`); None when no installed app says how `kind` belongs to teams."""
    in_teams = _IN_TEAMS.get(kind)
    return None if in_teams is None else in_teams(teams)
