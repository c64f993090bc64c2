"""Which ids name real things, for apps below the app that owns them.

The ledger and budgets name work by (subject_type, subject_id): a budget on a training run holds
the run's id, but billing may not import training (README, "Import layers"). The app that owns
a kind registers how to tell whether an id exists (training does in TrainingConfig.ready), and
billing asks here, so a budget on a run that does not exist is refused instead of never
counting anything.
"""

from __future__ import annotations

from collections.abc import Callable

_EXISTS: dict[str, Callable[[str], bool]] = {}


def subject_kind_register(kind: str, *, exists: Callable[[str], bool]) -> None:
    """Register how to tell whether a `kind` with a given id exists (idempotent: the last wins)."""
    _EXISTS[kind] = exists


def subject_exists(kind: str, subject_id: str) -> bool | None:
    """Whether the `kind` with this id exists; None when no installed app knows the kind."""
    exists = _EXISTS.get(kind)
    return None if exists is None else exists(subject_id)
