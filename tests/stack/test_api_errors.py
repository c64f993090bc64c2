"""Domain errors reach API clients as clear status codes, and roll back what the request wrote."""

from __future__ import annotations

from billing.budgets import BudgetExhausted
from stack.api_errors import exception_handler


def test_a_spent_budget_fails_closed_with_402_naming_the_budget() -> None:
    response = exception_handler(
        BudgetExhausted("budget gpu-monthly is spent: 20.00 of 20.00 USD", budget_id=3), {}
    )
    assert response is not None
    assert response.status_code == 402
    assert response.data == {
        "detail": "budget gpu-monthly is spent: 20.00 of 20.00 USD",
        "code": "budget_exhausted",
    }
