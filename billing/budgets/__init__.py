"""Budgets: spend per period, threshold alerts, hard limits and a burn-rate forecast.

How the numbers stay exact:

* `budget_record_spend` runs inside `billing.services.usage_record_batch`, in
  the same transaction and under the ledger head's row lock. Every ledger write
  is serialised there, so adding each row's amount to its budgets' period
  totals needs no further coordination: `BudgetPeriod.spent` is the ledger's
  own sum for the budget's scope, period and currency.
* A period row is created (with its opening balance summed from the ledger)
  only while holding that same head lock, so no ledger row can slip between the
  opening sum and the row becoming visible to the hook.
* Hard limits (`budget_admit`) lock the matching periods (always in primary-key
  order, so two admissions never wait on each other in a cycle), refuse when
  spent + reserved has reached the limit and otherwise reserve the estimate.
  The caller spends, writes the ledger (which raises `spent`) and then settles
  (which drops the reservation). Between the ledger write and the settle the
  cost counts twice, which errs on the side of refusing. Requests racing for
  the last cents therefore overspend by at most the cost of one request: each
  is admitted only while spent + reserved < limit, and every admitted request
  is counted in `reserved` until its real cost is in `spent`. A caller whose spend is
  written later by someone else (a journaled /v1 request, written by the journal's fold)
  hands its reservations over (`budget_hand_off`); the writer releases them
  (`budget_holds_release`) once the spend is committed.

Lock order, to stay free of deadlocks: ledger head, then budget periods by id.
A caller must not write the ledger in the same transaction after `budget_admit`
while other writers run (admit first in its own transaction, as
`budget_admission` does when called outside a transaction).

The modules, lowest first: errors, targets (which budgets a spend falls under),
periods (bounds and running-total rows), state (reads and forecast), writes
(saving budgets, acknowledging alerts), teams (which budgets a team owns),
ledger_hook (called by the ledger writer; its alerts are sent by billing.alerts,
to the budget's own email and webhook and to the alert channels), admission
(hard limits). Import from here; the split is this
package's own business.
"""

from __future__ import annotations

from billing.budgets.admission import (
    Admission,
    budget_admission,
    budget_admit,
    budget_hand_off,
    budget_headroom,
    budget_holds_release,
    budget_may_spend,
    budget_settle,
)
from billing.budgets.errors import BudgetExhausted, BudgetInvalid
from billing.budgets.ledger_hook import budget_record_spend
from billing.budgets.periods import ZERO, budget_period_bounds
from billing.budgets.state import (
    HUNDRED,
    BudgetState,
    Forecast,
    budget_alerts_open,
    budget_forecast,
    budget_state,
)
from billing.budgets.targets import SpendTarget, budget_hard_limit_keys, budgets_for_target, spend_target
from billing.budgets.teams import PLATFORM_SCOPES, budget_team_errors, budgets_of_teams
from billing.budgets.writes import budget_alert_acknowledge, budget_delete, budget_errors, budget_save

__all__ = [
    "HUNDRED",
    "PLATFORM_SCOPES",
    "ZERO",
    "Admission",
    "BudgetExhausted",
    "BudgetInvalid",
    "BudgetState",
    "Forecast",
    "SpendTarget",
    "budget_admission",
    "budget_admit",
    "budget_alert_acknowledge",
    "budget_alerts_open",
    "budget_delete",
    "budget_errors",
    "budget_forecast",
    "budget_hand_off",
    "budget_hard_limit_keys",
    "budget_headroom",
    "budget_holds_release",
    "budget_may_spend",
    "budget_period_bounds",
    "budget_record_spend",
    "budget_save",
    "budget_settle",
    "budget_state",
    "budget_team_errors",
    "budgets_for_target",
    "budgets_of_teams",
    "spend_target",
]
