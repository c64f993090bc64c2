"""Budget pages under /billing/budgets/: the list with this period's figures and open alerts, the form."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views import View

from billing.budgets import (
    BudgetInvalid,
    budget_alert_acknowledge,
    budget_alerts_open,
    budget_save,
    budget_state,
)
from billing.forms import BudgetForm
from billing.models import Budget, BudgetAlert
from billing.selectors import budgets_of_teams
from registry.auth.roles import LEDGER_READERS, OPERATORS
from registry.auth.teams import user_teams_with_role
from registry.views import RoleRequiredMixin


class BudgetListView(RoleRequiredMixin, View):
    read_roles = LEDGER_READERS
    write_roles = OPERATORS

    def get(self, request: HttpRequest) -> HttpResponse:
        budgets = budgets_of_teams(teams=user_teams_with_role(request.user, LEDGER_READERS))
        writable = set(budgets_writable(request.user).values_list("pk", flat=True))
        rows = []
        for budget in budgets:
            state = budget_state(budget=budget)
            bar = min(state.percent, 100) if state is not None else 0
            rows.append(
                {"budget": budget, "state": state, "bar": f"{bar}", "target": budget.target_label(),
                 "writable": budget.pk in writable}
            )  # fmt: skip
        alerts = list(budget_alerts_open().filter(budget__in=budgets)[:50])
        for alert in alerts:
            alert.writable = alert.budget_id in writable  # type: ignore[attr-defined]
        return render(
            request,
            "billing/budget_list.html",
            {
                "rows": rows,
                "alerts": alerts,
                "can_write": user_teams_with_role(request.user, OPERATORS) != frozenset(),
            },
        )


def budgets_writable(user: Any) -> QuerySet[Budget]:
    """The budgets `user` may change: every one for a platform operator, its operated teams' ones
    for a team-scoped user."""
    return budgets_of_teams(teams=user_teams_with_role(user, OPERATORS))


def _budget_for_write(request: HttpRequest, pk: int) -> Budget:
    """The budget to change: 404 when the caller cannot see it, 403 when it sees but may not change it."""
    budget = get_object_or_404(
        budgets_of_teams(teams=user_teams_with_role(request.user, LEDGER_READERS)), pk=pk
    )
    if not budgets_writable(request.user).filter(pk=pk).exists():
        raise PermissionDenied("your role in this budget's team does not allow this")
    return budget


class BudgetFormView(RoleRequiredMixin, View):
    read_roles = OPERATORS
    write_roles = OPERATORS

    def _budget(self, request: HttpRequest, pk: int | None) -> Budget:
        return _budget_for_write(request, pk) if pk is not None else Budget()

    def _form(self, request: HttpRequest, budget: Budget, data: Any = None) -> BudgetForm:
        writable = user_teams_with_role(request.user, OPERATORS)
        return BudgetForm(data, instance=budget, writable_teams=writable)

    def get(self, request: HttpRequest, pk: int | None = None) -> HttpResponse:
        budget = self._budget(request, pk)
        return self._render(request, self._form(request, budget), budget)

    def post(self, request: HttpRequest, pk: int | None = None) -> HttpResponse:
        budget = self._budget(request, pk)
        form = self._form(request, budget, request.POST)
        if form.is_valid():
            budget = form.save(commit=False)
            budget.thresholds = form.cleaned_data["thresholds"]
            try:
                budget_save(
                    budget=budget,
                    webhook_secret=form.webhook_secret_change(),
                    by_platform=user_teams_with_role(request.user, OPERATORS) is None,
                )
            except BudgetInvalid as exc:
                for name, problems in exc.errors.items():
                    for problem in problems:
                        form.add_error(name if name in form.fields else None, problem)
            else:
                messages.success(request, f"Budget {budget.name} saved.")
                return HttpResponseRedirect(reverse("billing-budgets"))
        return self._render(request, form, budget, status=400)

    def _render(
        self, request: HttpRequest, form: BudgetForm, budget: Budget, status: int = 200
    ) -> HttpResponse:
        note = ""
        if budget.pk:
            note = "A webhook secret is stored (encrypted)." if budget.webhook_secret_encrypted else ""
        response = render(
            request,
            "billing/budget_form.html",
            {
                "form": form,
                "budget": budget,
                "title": "Edit budget" if budget.pk else "New budget",
                "note": note,
            },
            status=status,
        )
        response["Cache-Control"] = "no-store"
        return response


class BudgetAlertAcknowledgeView(RoleRequiredMixin, View):
    read_roles = OPERATORS
    write_roles = OPERATORS

    def post(self, request: HttpRequest, pk: int) -> HttpResponse:
        alert = get_object_or_404(BudgetAlert.objects.select_related("budget"), pk=pk)
        _budget_for_write(request, alert.budget_id)
        alert = budget_alert_acknowledge(alert=alert)
        messages.success(request, f"Alert acknowledged: {alert}.")
        return HttpResponseRedirect(reverse("billing-budgets"))
