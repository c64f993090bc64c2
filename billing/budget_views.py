"""Budgets: the API (/api/budgets/, /api/budget-alerts/) and the pages under /billing/budgets/."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views import View
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from billing.budgets import (
    BudgetInvalid,
    BudgetState,
    budget_alert_acknowledge,
    budget_alerts_open,
    budget_errors,
    budget_save,
    budget_state,
)
from billing.models import Budget, BudgetAlert
from billing.services import AMOUNT_QUANTUM
from stack.registry.forms import formfield_with_https_urls
from stack.registry.models import Cluster, Provider, Workflow
from stack.registry.roles import OPERATORS, Role, user_has_role
from stack.registry.views import RoleRequiredMixin

CENT = Decimal("0.01")
BUDGET_READERS = frozenset({Role.AUDITOR, Role.OPERATOR, Role.ADMIN})


def _exact(value: Decimal) -> str:
    """As the ledger stores money: 9 decimal places (SQLite hands back more digits)."""
    return str(value.quantize(AMOUNT_QUANTUM))


def budget_state_json(state: BudgetState | None) -> dict[str, Any] | None:
    if state is None:
        return None
    return {
        "start": state.start.isoformat(),
        "end": state.end.isoformat(),
        "spent": _exact(state.spent),
        "reserved": _exact(state.reserved),
        "limit": _exact(state.limit),
        "remaining": _exact(state.remaining),
        "percent": str(state.percent),
        "forecast": state.forecast.text,
        "runs_out_at": state.forecast.runs_out_at.isoformat() if state.forecast.runs_out_at else None,
        "projected_spend": str(state.forecast.projected_spend.quantize(CENT)),
    }


# --- API ------------------------------------------------------------------------------------------


class BudgetSerializer(serializers.ModelSerializer[Budget]):
    workflow = serializers.SlugRelatedField(
        slug_field="slug", queryset=Workflow.objects.all(), required=False, allow_null=True
    )
    provider = serializers.SlugRelatedField(
        slug_field="slug", queryset=Provider.objects.all(), required=False, allow_null=True
    )
    cluster = serializers.SlugRelatedField(
        slug_field="slug", queryset=Cluster.objects.all(), required=False, allow_null=True
    )
    thresholds = serializers.ListField(child=serializers.IntegerField(), required=False)
    webhook_secret = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        trim_whitespace=False,
        style={"input_type": "password"},
        help_text="write-only HMAC key for the webhook's X-Switchyard-Signature; an empty string clears it",
    )
    has_webhook_secret = serializers.SerializerMethodField()
    current = serializers.SerializerMethodField(help_text="this period: spent, reserved, limit, forecast")

    class Meta:
        model = Budget
        fields = [
            "id",
            "name",
            "scope",
            "workflow",
            "provider",
            "cluster",
            "team",
            "training_run_id",
            "period",
            "custom_start",
            "custom_end",
            "limit_amount",
            "currency",
            "thresholds",
            "hard_limit",
            "email_to",
            "webhook_url",
            "webhook_secret",
            "has_webhook_secret",
            "active",
            "created_at",
            "current",
        ]
        read_only_fields = ["id", "created_at"]

    def get_has_webhook_secret(self, budget: Budget) -> bool:
        return bool(budget.webhook_secret_encrypted)

    def get_current(self, budget: Budget) -> dict[str, Any] | None:
        return budget_state_json(budget_state(budget=budget))

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        values = (
            {f.name: getattr(self.instance, f.name) for f in Budget._meta.concrete_fields}
            if self.instance
            else {}
        )
        values.update(attrs)
        secret = attrs.get("webhook_secret")
        has_secret = bool(secret) if secret is not None else bool(values.get("webhook_secret_encrypted"))
        errors = budget_errors(values=values, has_secret=has_secret)
        if errors:
            raise serializers.ValidationError(errors)
        return attrs

    def _save(self, budget: Budget, validated_data: dict[str, Any]) -> Budget:
        secret = validated_data.pop("webhook_secret", None)
        for name, value in validated_data.items():
            setattr(budget, name, value)
        try:
            return budget_save(budget=budget, webhook_secret=secret)
        except BudgetInvalid as exc:
            raise serializers.ValidationError(exc.errors) from exc

    def create(self, validated_data: dict[str, Any]) -> Budget:
        return self._save(Budget(), validated_data)

    def update(self, instance: Budget, validated_data: dict[str, Any]) -> Budget:
        return self._save(instance, validated_data)


class BudgetViewSet(viewsets.ModelViewSet[Budget]):
    """Budgets per workflow, provider, cluster, team or training run, with this period's figures."""

    serializer_class = BudgetSerializer
    read_roles = BUDGET_READERS
    write_roles = OPERATORS
    queryset = Budget.objects.select_related("workflow", "provider", "cluster")


class BudgetAlertSerializer(serializers.ModelSerializer[BudgetAlert]):
    budget_name = serializers.CharField(source="budget.name", read_only=True)

    class Meta:
        model = BudgetAlert
        fields = [
            "id",
            "budget",
            "budget_name",
            "period_start",
            "threshold_percent",
            "spent",
            "limit_amount",
            "triggered_at",
            "email_sent_at",
            "webhook_sent_at",
            "webhook_status",
            "acknowledged_at",
        ]
        read_only_fields = fields


class BudgetAlertViewSet(viewsets.ReadOnlyModelViewSet[BudgetAlert]):
    """Threshold alerts (`?open=1`: not acknowledged yet); POST .../acknowledge/ marks one seen."""

    serializer_class = BudgetAlertSerializer
    read_roles = BUDGET_READERS
    write_roles = OPERATORS

    def get_queryset(self) -> QuerySet[BudgetAlert]:
        alerts = BudgetAlert.objects.select_related("budget")
        params = self.request.query_params
        if params.get("open") in ("1", "true"):
            alerts = alerts.filter(acknowledged_at__isnull=True)
        if params.get("budget", "").isdigit():
            alerts = alerts.filter(budget_id=params["budget"])
        return alerts

    @action(detail=True, methods=["post"])
    def acknowledge(self, request: Request, pk: str | None = None) -> Response:
        alert = budget_alert_acknowledge(alert=self.get_object())
        return Response(BudgetAlertSerializer(alert).data)


# --- Pages ------------------------------------------------------------------------------------------


class BudgetForm(forms.ModelForm[Budget]):
    thresholds_text = forms.CharField(
        label="Alert thresholds (%)",
        required=False,
        initial="50, 80, 100",
        help_text="Comma-separated percentages of the limit, e.g. 50, 80, 100.",
    )
    webhook_secret = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only HMAC key: stored encrypted, never shown. Leave empty to keep the current one.",
    )
    clear_webhook_secret = forms.BooleanField(required=False, label="Clear the stored webhook secret")

    class Meta:
        model = Budget
        fields = [
            "name",
            "scope",
            "workflow",
            "provider",
            "cluster",
            "team",
            "training_run_id",
            "period",
            "custom_start",
            "custom_end",
            "limit_amount",
            "currency",
            "hard_limit",
            "email_to",
            "webhook_url",
            "active",
        ]
        formfield_callback = formfield_with_https_urls
        help_texts = {
            "custom_start": "Custom periods only; UTC, e.g. 2026-01-01 00:00.",
            "custom_end": "Custom periods only; UTC, exclusive.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["thresholds_text"].initial = ", ".join(str(t) for t in self.instance.thresholds)

    def webhook_secret_change(self) -> str | None:
        """'' to clear, a new value to store, None to keep what is stored."""
        if self.cleaned_data.get("clear_webhook_secret"):
            return ""
        value: str = self.cleaned_data.get("webhook_secret") or ""
        return value or None

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        text = cleaned.get("thresholds_text") or ""
        try:
            thresholds = [int(part) for part in text.replace(";", ",").split(",") if part.strip()]
        except ValueError:
            self.add_error("thresholds_text", "whole percentages separated by commas, e.g. 50, 80, 100")
            return cleaned
        cleaned["thresholds"] = thresholds
        change = self.webhook_secret_change()
        has_secret = bool(change) if change is not None else bool(self.instance.webhook_secret_encrypted)
        errors = budget_errors(values=cleaned, has_secret=has_secret)
        for name, problems in errors.items():
            target = {"thresholds": "thresholds_text"}.get(name, name)
            for problem in problems:
                self.add_error(target if target in self.fields else None, problem)
        return cleaned


class BudgetListView(RoleRequiredMixin, View):
    read_roles = BUDGET_READERS
    write_roles = OPERATORS

    def get(self, request: HttpRequest) -> HttpResponse:
        budgets = Budget.objects.select_related("workflow", "provider", "cluster")
        rows = []
        for budget in budgets:
            state = budget_state(budget=budget)
            bar = min(state.percent, 100) if state is not None else 0
            rows.append({"budget": budget, "state": state, "bar": f"{bar}", "target": _target_label(budget)})
        return render(
            request,
            "billing/budget_list.html",
            {
                "rows": rows,
                "alerts": budget_alerts_open()[:50],
                "can_write": user_has_role(request.user, OPERATORS),
            },
        )


def _target_label(budget: Budget) -> str:
    value = {
        Budget.Scope.WORKFLOW: budget.workflow.slug if budget.workflow else "",
        Budget.Scope.PROVIDER: budget.provider.slug if budget.provider else "",
        Budget.Scope.CLUSTER: budget.cluster.slug if budget.cluster else "",
        Budget.Scope.TEAM: budget.team,
        Budget.Scope.TRAINING_RUN: budget.training_run_id,
    }[Budget.Scope(budget.scope)]
    return f"{budget.get_scope_display()} {value}"


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
