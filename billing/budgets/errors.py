"""What budgets raise: a spend refused by a hard limit, a budget that does not fit together."""

from __future__ import annotations

from decimal import Decimal

from registry.errors import DomainError, MultiFieldError


class BudgetExhausted(DomainError):
    """A hard-limit budget has no room left; nothing was spent or reserved.

    The API fails closed with 402, naming the budget: the caller may not spend until it is raised."""

    status_code = 402

    def __init__(self, message: str, *, budget_id: int | None, reserved: Decimal = Decimal(0)) -> None:
        # budget_id None: a refusal replayed from its record (inference.router.finish.replay).
        # reserved: what requests in flight held in the budget's period when it refused.
        super().__init__(message)
        self.budget_id = budget_id
        self.reserved = reserved

    def api_body(self) -> dict[str, object]:
        return {"detail": str(self), "code": "budget_exhausted"}


class BudgetInvalid(MultiFieldError, ValueError):
    """A budget's fields do not fit together; `errors` maps field names to messages."""
