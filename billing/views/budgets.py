"""Budget pages under /billing/budgets/: the list with this period's figures and open alerts, the form."""

from __future__ import annotations

from django.contrib import messages
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
from stack.registry.roles import LEDGER_READERS, OPERATORS, user_has_role
from stack.registry.views import RoleRequiredMixin


class BudgetListView(RoleRequiredMixin, View):
    read_roles = LEDGER_READERS
    write_roles = OPERATORS

    def get(self, request: HttpRequest) -> HttpResponse:
        budgets = Budget.objects.select_related("workflow", "provider", "cluster")
        rows = []
        for budget in budgets:
            state = budget_state(budget=budget)
            bar = min(state.percent, 100) if state is not None else 0
            rows.append({"budget": budget, "state": state, "bar": f"{bar}", "target": budget.target_label()})
        return render(
            request,
            "billing/budget_list.html",
            {
                "rows": rows,
                "alerts": budget_alerts_open()[:50],
                "can_write": user_has_role(request.user, OPERATORS),
            },
        )


class BudgetFormView(RoleRequiredMixin, View):
    read_roles = OPERATORS
    write_roles = OPERATORS

    def _budget(self, pk: int | None) -> Budget:
        return get_object_or_404(Budget, pk=pk) if pk is not None else Budget()

    def get(self, request: HttpRequest, pk: int | None = None) -> HttpResponse:
        budget = self._budget(pk)
        return self._render(request, BudgetForm(instance=budget), budget)

    def post(self, request: HttpRequest, pk: int | None = None) -> HttpResponse:
        budget = self._budget(pk)
        form = BudgetForm(request.POST, instance=budget)
        if form.is_valid():
            budget = form.save(commit=False)
            budget.thresholds = form.cleaned_data["thresholds"]
            try:
                budget_save(budget=budget, webhook_secret=form.webhook_secret_change())
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
        alert = budget_alert_acknowledge(alert=get_object_or_404(BudgetAlert, pk=pk))
        messages.success(request, f"Alert acknowledged: {alert}.")
        return HttpResponseRedirect(reverse("billing-budgets"))
