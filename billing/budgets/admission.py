"""Hard limits: admit a spend (reserving room in its periods) or refuse it, then settle; a read-only check."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Greatest
from django.utils import timezone

from billing.budgets.errors import BudgetExhausted
from billing.budgets.periods import ZERO, budget_period_bounds, budget_period_open
from billing.budgets.state import budget_state
from billing.budgets.targets import SpendTarget, budgets_for_target
from billing.models import Budget, BudgetPeriod
from billing.money import message_text


def _exhausted_message(
    *, budget: Budget, spent: Decimal, reserved: Decimal, start: datetime, end: datetime
) -> str:
    held = f" (+{message_text(reserved)} reserved by requests in flight)" if reserved else ""
    return (
        f"budget {budget.name!r} is spent: {message_text(spent)}{held} of its {message_text(budget.limit_amount)} "
        f"{budget.currency} limit for {start:%Y-%m-%d %H:%M}–{end:%Y-%m-%d %H:%M} UTC"
    )


@dataclass
class Admission:
    """Room reserved in hard-limit budgets for one spend; hand it to `budget_settle` afterwards."""

    estimate: Decimal
    currency: str
    # (BudgetPeriod id, amount reserved there); empty when no hard limit applies.
    reservations: tuple[tuple[int, Decimal], ...] = ()
    budget_names: tuple[str, ...] = ()
    settled: bool = field(default=False, compare=False)


def budget_admit(
    *, estimate: Decimal, target: SpendTarget, currency: str = "USD", cached_budgets: bool = False
) -> Admission:
    """Ask "may I spend about `estimate`?" of every hard-limit budget the spend on `target`
    (spend_target(...)) falls under.

    Raises BudgetExhausted (naming the budget, its limit, spent and period)
    when one has spent + reserved >= limit, and then reserves nothing.
    Otherwise reserves `estimate` in each (same-currency) budget and returns
    the Admission; after the real cost is in the ledger, call budget_settle.
    A budget in another currency still refuses once it is spent. `cached_budgets`: which budgets
    exist is read from this process's copy (billing.budgets.targets); their spend never is.

    Every admission under a hard limit reserves, in a locked row, whatever the concurrency: an
    admission that did not (a per-process "far from the limit" shortcut, as there once was)
    lets simultaneous calls from other processes spend past the limit together. So a hard
    budget is overspent by at most one call's `estimate` when the estimate is that call's worst
    case (inference.admission).
    """
    if not isinstance(estimate, Decimal) or estimate < 0:
        raise ValueError("estimate must be a non-negative Decimal")
    now = timezone.now()
    hard: list[tuple[Budget, datetime, datetime]] = []
    for budget in budgets_for_target(target=target, cached=cached_budgets):
        span = budget_period_bounds(budget=budget, at=now) if budget.hard_limit else None
        if span is not None:
            hard.append((budget, *span))
    if not hard:
        return Admission(estimate=estimate, currency=currency)
    by_id = {budget.pk: budget for budget, _, _ in hard}
    with transaction.atomic():
        # Create missing periods first (that takes the ledger head lock), then
        # lock the periods in id order: the module's lock order. The periods that exist (all of
        # them but at a period's start) are found in one query.
        rows = BudgetPeriod.objects.filter(budget_id__in=by_id, start__in={start for _, start, _ in hard})
        existing = {
            (budget_id, start): pk for budget_id, start, pk in rows.values_list("budget_id", "start", "pk")
        }
        ids = [
            existing.get((budget.pk, start)) or budget_period_open(budget=budget, start=start, end=end).pk
            for budget, start, end in hard
        ]
        periods = list(BudgetPeriod.objects.select_for_update().filter(pk__in=ids).order_by("pk"))
        for period in periods:
            budget = by_id[period.budget_id]
            if period.spent + period.reserved >= budget.limit_amount:
                raise BudgetExhausted(
                    _exhausted_message(
                        budget=budget,
                        spent=period.spent,
                        reserved=period.reserved,
                        start=period.start,
                        end=period.end,
                    ),
                    budget_id=budget.pk,
                    reserved=period.reserved,
                )
        reservations = [
            (period.pk, estimate)
            for period in periods
            if by_id[period.budget_id].currency == currency and estimate != 0
        ]
        if reservations:  # rows this transaction already holds locked: one UPDATE for all
            BudgetPeriod.objects.filter(pk__in=[pk for pk, _ in reservations]).update(
                reserved=F("reserved") + estimate
            )
    return Admission(
        estimate=estimate,
        currency=currency,
        reservations=tuple(reservations),
        budget_names=tuple(budget.name for budget, _, _ in hard),
    )


def budget_settle(*, admission: Admission) -> None:
    """Release an admission's reservations (its real cost reaches `spent` through the ledger).

    Settling twice is a no-op. Call it after the usage is recorded, also when
    the spend failed (then nothing was recorded and the room comes back).
    """
    if not admission.settled:
        budget_holds_release(admission.reservations)
    admission.settled = True


def budget_hand_off(admission: Admission) -> tuple[tuple[int, Decimal], ...]:
    """Hand an admission's reservations over to whoever writes its spend to the ledger later
    (a journaled request's fold): the admission counts as settled here (``budget_settle`` on it
    is a no-op), and the holds returned must reach ``budget_holds_release`` once the spend is
    committed in the ledger. Until then the room stays reserved."""
    holds = () if admission.settled else admission.reservations
    admission.settled = True
    return holds


def budget_holds_release(holds: Sequence[tuple[int, Decimal]]) -> None:
    """Release reservations, (BudgetPeriod id, amount) pairs: those of a settled admission, or
    those handed off (``budget_hand_off``) once their spend is committed in the ledger. Call
    it after that commit, not in the same transaction: between the two the cost counts twice,
    which errs on the side of refusing, and the periods' locks are taken in id order alone."""
    amounts: dict[int, Decimal] = {}
    for pk, amount in holds:
        amounts[pk] = amounts.get(pk, ZERO) + amount
    if not amounts:
        return
    with transaction.atomic():
        # One UPDATE per period, in id order (each takes its row's lock: the module's lock
        # order), never below zero: a period reset by hand must not go negative.
        for pk in sorted(amounts):
            BudgetPeriod.objects.filter(pk=pk).update(reserved=Greatest(F("reserved") - amounts[pk], ZERO))


@contextmanager
def budget_admission(
    *, estimate: Decimal, target: SpendTarget, currency: str = "USD", cached_budgets: bool = False
) -> Iterator[Admission]:
    """`with budget_admission(estimate=..., target=spend_target(workflow=wf)): call; usage_record(...)`
    — admit, then settle.

    The shape the inference router wants: call it outside a transaction, so
    the period locks are held only for the admission itself.
    """
    admission = budget_admit(
        estimate=estimate, target=target, currency=currency, cached_budgets=cached_budgets
    )
    try:
        yield admission
    finally:
        budget_settle(admission=admission)


def budget_may_spend(*, target: SpendTarget) -> tuple[bool, str]:
    """Read-only: (False, why) when a hard-limit budget of a spend on `target` is spent, else (True, "")."""
    now = timezone.now()
    for budget in budgets_for_target(target=target):
        if not budget.hard_limit:
            continue
        state = budget_state(budget=budget, now=now)
        if state is not None and state.spent + state.reserved >= budget.limit_amount:
            return False, _exhausted_message(
                budget=budget, spent=state.spent, reserved=state.reserved, start=state.start, end=state.end
            )
    return True, ""


def budget_headroom(*, target: SpendTarget) -> Decimal | None:
    """Read-only: what the tightest hard-limit budget of a spend on `target` still allows this
    period (its limit less spent and reserved; at most zero once spent); None when no hard budget
    covers the target. A training chunk stops when its running cost reaches it."""
    now = timezone.now()
    room: Decimal | None = None
    for budget in budgets_for_target(target=target):
        if not budget.hard_limit:
            continue
        state = budget_state(budget=budget, now=now)
        if state is None:
            continue
        left = budget.limit_amount - state.spent - state.reserved
        room = left if room is None else min(room, left)
    return room
