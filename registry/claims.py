"""Claims and leases on job rows: the one way a job runner takes, keeps and lets go of its work.

Every runner (export jobs, probe jobs, eval runs, batch jobs, replay studies, version
evaluations, a run's syncer chain) records its work as a row with a state column, and a task
that may be delivered twice, or run by a second worker, or outlive its worker. Each step is one
conditional UPDATE on that row whose row count says whether this caller won; nothing is read
first, so two claimants racing on one row cannot both win (PostgreSQL re-checks the WHERE clause
on the row version the first committer left).

* `row_claim`: move the row from one of `from_states` to `to_state` (a pending row claimed once;
  a duplicate delivery finds it moved and does nothing).
* `lease_claim`: take a lease: a pending row, or a running one whose `heartbeat` column is older
  than `stale_after` (its holder died). The heartbeat is set to `now`, the lease token.
* `lease_renew`: the holder writes a fresh heartbeat, only while the row is still in `states` and
  still holds `holder` (the token it last wrote, or another column naming it); None when the
  lease was lost (taken over, cancelled, finished).
* `lease_release`: end a lease (or hand a stale one back): move the row to `to_state`, only while
  it is in `states` and holds `holder`.

Claims that need a row lock held across work (SELECT ... FOR UPDATE: a learner chunk's budget
and cluster checks, an alert's delivery while it is sent) or that pick up a batch of rows
(SKIP LOCKED: the journal fold) are not conditional UPDATEs and stay where they are; each says why.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime, timedelta
from typing import Any

from django.db import models
from django.db.models import Q
from django.utils import timezone

# A lease token must change on every renewal: two renewals within one clock tick would write the
# same timestamp, and a holder that lost the lease in between would still match it.
_TICK = timedelta(microseconds=1)


def _rows(model: type[models.Model], pk: Any) -> models.QuerySet[Any]:
    return model._default_manager.filter(pk=pk)


def row_claim(
    model: type[models.Model],
    *,
    pk: Any,
    from_states: Collection[str],
    to_state: str,
    field: str = "state",
    **changes: Any,
) -> bool:
    """Move row `pk` from one of `from_states` to `to_state` (writing `changes` too); True when
    this caller won. A second claimant, or a row gone, gets False."""
    n = _rows(model, pk).filter(**{f"{field}__in": list(from_states)}).update(**{field: to_state}, **changes)
    return n == 1


def lease_claim(
    model: type[models.Model],
    *,
    pk: Any,
    pending: str,
    running: str,
    heartbeat: str,
    stale_after: timedelta,
    now: datetime | None = None,
    field: str = "state",
    **changes: Any,
) -> datetime | None:
    """Take row `pk`'s lease: a `pending` row, or a `running` one whose `heartbeat` is older than
    `now - stale_after` (a running row with no heartbeat is not taken). The row becomes
    `running` with `heartbeat = now` (and `changes`); returns `now`, the lease token, or None
    when another holder has a fresh lease or the row is finished or gone."""
    now = timezone.now() if now is None else now
    claimable = Q(**{field: pending}) | Q(**{field: running, f"{heartbeat}__lt": now - stale_after})
    n = _rows(model, pk).filter(claimable).update(**{field: running, heartbeat: now}, **changes)
    return now if n == 1 else None


def lease_renew(
    model: type[models.Model],
    *,
    pk: Any,
    states: Collection[str],
    heartbeat: str,
    holder: Mapping[str, Any] | None = None,
    now: datetime | None = None,
    field: str = "state",
    **changes: Any,
) -> datetime | None:
    """Write a fresh `heartbeat` on row `pk` while it is in `states` and its columns match
    `holder` (e.g. `{heartbeat: token}`, a compare-and-set on the lease token); returns the new
    heartbeat, the next token (always later than a token in `holder`), or None when the lease
    was lost."""
    holder = holder or {}
    now = timezone.now() if now is None else now
    token = holder.get(heartbeat)
    if isinstance(token, datetime) and now <= token:
        now = token + _TICK
    rows = _rows(model, pk).filter(**{f"{field}__in": list(states)}, **holder)
    n = rows.update(**{heartbeat: now}, **changes)
    return now if n == 1 else None


def lease_release(
    model: type[models.Model],
    *,
    pk: Any,
    states: Collection[str],
    to_state: str,
    heartbeat: str,
    holder: Mapping[str, Any] | None = None,
    now: datetime | None = None,
    field: str = "state",
    **changes: Any,
) -> bool:
    """Move row `pk` to `to_state` with `heartbeat = now` (and `changes`) while it is in `states`
    and its columns match `holder`: a holder finishing its work, or a sweep handing a stale
    lease back (to pending). True when this caller won."""
    now = timezone.now() if now is None else now
    rows = _rows(model, pk).filter(**{f"{field}__in": list(states)}, **(holder or {}))
    return rows.update(**{field: to_state, heartbeat: now}, **changes) == 1
