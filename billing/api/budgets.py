"""Budgets' API: /api/budgets/ with this period's figures, and /api/budget-alerts/."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, extend_schema_view
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from billing.budgets import (
    BudgetInvalid,
    BudgetState,
    budget_alert_acknowledge,
    budget_delete,
    budget_errors,
    budget_save,
    budget_state,
    budget_team_errors,
    budgets_of_teams,
)
from billing.models import Budget, BudgetAlert
from billing.money import CENT, ledger_text
from registry.api.fields import IntegerField, ModelSerializer, ResponseSerializer
from registry.auth.roles import LEDGER_READERS, OPERATORS
from registry.auth.scoping import request_scope_teams, scope_requires_workflow, scoped_workflow_field
from registry.models import Cluster, Provider
from registry.validation import id_parse


def budget_state_json(state: BudgetState | None) -> dict[str, Any] | None:
    if state is None:
        return None
    return {
        "start": state.start.isoformat(),
        "end": state.end.isoformat(),
        "spent": ledger_text(state.spent),
        "reserved": ledger_text(state.reserved),
        "limit": ledger_text(state.limit),
        "remaining": ledger_text(state.remaining),
        "percent": str(state.percent),
        "forecast": state.forecast.text,
        "runs_out_at": state.forecast.runs_out_at.isoformat() if state.forecast.runs_out_at else None,
        "projected_spend": str(state.forecast.projected_spend.quantize(CENT)),
    }


# The schema of budget_state_json (documentation only).
class BudgetFiguresSerializer(ResponseSerializer):
    """This period's figures: money as text, and when the budget runs out at the current rate."""

    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    spent = serializers.CharField()
    reserved = serializers.CharField()
    limit = serializers.CharField()
    remaining = serializers.CharField()
    percent = serializers.CharField()
    forecast = serializers.CharField()
    runs_out_at = serializers.DateTimeField(allow_null=True)
    projected_spend = serializers.CharField()


class BudgetSerializer(ModelSerializer[Budget]):
    workflow = scoped_workflow_field(required=False, allow_null=True)
    provider = serializers.SlugRelatedField(
        slug_field="slug", queryset=Provider.objects.all(), required=False, allow_null=True
    )
    cluster = serializers.SlugRelatedField(
        slug_field="slug", queryset=Cluster.objects.all(), required=False, allow_null=True
    )
    thresholds = serializers.ListField(child=IntegerField(), required=False)
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

    @extend_schema_field(BudgetFiguresSerializer(allow_null=True))
    def get_current(self, budget: Budget) -> dict[str, Any] | None:
        return budget_state_json(budget_state(budget=budget))

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        values = (
            {f.name: getattr(self.instance, f.name) for f in Budget._meta.concrete_fields}
            if self.instance
            else {}
        )
        values.update(attrs)
        # A token limited to workflows keeps budgets of those workflows only: another scope's
        # hard limit would stop every workflow's spend.
        scope_requires_workflow(
            self.context["request"],
            values.get("workflow") if values.get("scope") == Budget.Scope.WORKFLOW else None,
        )
        # A team-scoped caller keeps the budgets of its teams (where it may write): another
        # team's target reads as one that does not exist; provider and cluster budgets are
        # the platform's.
        write_roles = frozenset(getattr(self.context.get("view"), "write_roles", OPERATORS))
        team_errors = budget_team_errors(
            values=values, teams=request_scope_teams(self.context["request"], write_roles)
        )
        if team_errors:
            raise serializers.ValidationError(team_errors)
        secret = attrs.get("webhook_secret")
        has_secret = bool(secret) if secret is not None else bool(values.get("webhook_secret_encrypted"))
        errors = budget_errors(values=values, has_secret=has_secret)
        if errors:
            raise serializers.ValidationError(errors)
        return attrs

    def _by_platform(self) -> bool:
        """Whether the caller writes platform-wide (not as a team's operator)."""
        write_roles = frozenset(getattr(self.context.get("view"), "write_roles", OPERATORS))
        return request_scope_teams(self.context["request"], write_roles) is None

    def _save(self, budget: Budget, validated_data: dict[str, Any]) -> Budget:
        secret = validated_data.pop("webhook_secret", None)
        for name, value in validated_data.items():
            setattr(budget, name, value)
        try:
            return budget_save(budget=budget, webhook_secret=secret, by_platform=self._by_platform())
        except BudgetInvalid as exc:
            raise serializers.ValidationError(exc.errors) from exc

    def create(self, validated_data: dict[str, Any]) -> Budget:
        return self._save(Budget(), validated_data)

    def update(self, instance: Budget, validated_data: dict[str, Any]) -> Budget:
        return self._save(instance, validated_data)


class BudgetViewSet(viewsets.ModelViewSet[Budget]):
    """Budgets per workflow, provider, cluster, team or training run, with this period's figures."""

    serializer_class = BudgetSerializer
    read_roles = LEDGER_READERS
    write_roles = OPERATORS
    queryset = Budget.objects.select_related("workflow", "provider", "cluster")
    workflow_field = "workflow"

    def team_scope_queryset(self, queryset: QuerySet[Budget], teams: frozenset[int]) -> QuerySet[Budget]:
        """Workflow, team and training-run budgets of the caller's teams (billing.budgets.teams)."""
        return queryset.filter(budgets_of_teams(teams))

    def perform_destroy(self, instance: Budget) -> None:
        try:
            budget_delete(
                budget=instance,
                by_platform=request_scope_teams(self.request, frozenset(self.write_roles)) is None,
            )
        except BudgetInvalid as exc:
            raise serializers.ValidationError(exc.errors) from exc


class BudgetAlertSerializer(ModelSerializer[BudgetAlert]):
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


@extend_schema_view(
    list=extend_schema(
        parameters=[
            OpenApiParameter("open", str, description="1 or true: only alerts not acknowledged yet"),
            OpenApiParameter("budget", str, description="only this budget's alerts (its id)"),
        ]
    )
)
class BudgetAlertViewSet(viewsets.ReadOnlyModelViewSet[BudgetAlert]):
    """Threshold alerts (`?open=1`: not acknowledged yet); POST .../acknowledge/ marks one seen."""

    serializer_class = BudgetAlertSerializer
    read_roles = LEDGER_READERS
    write_roles = OPERATORS
    query_params_known = ("open", "budget")
    workflow_field = "budget__workflow"

    def team_scope_queryset(
        self, queryset: QuerySet[BudgetAlert], teams: frozenset[int]
    ) -> QuerySet[BudgetAlert]:
        """The alerts of the budgets the caller's teams own."""
        return queryset.filter(budgets_of_teams(teams, prefix="budget__"))

    def get_queryset(self) -> QuerySet[BudgetAlert]:
        alerts = BudgetAlert.objects.select_related("budget")
        params = self.request.query_params
        if params.get("open") in ("1", "true"):
            alerts = alerts.filter(acknowledged_at__isnull=True)
        if params.get("budget"):
            budget_id = id_parse(params["budget"])
            if budget_id is None:
                raise serializers.ValidationError({"budget": ["a budget's id: a whole number"]})
            alerts = alerts.filter(budget_id=budget_id)
        return alerts

    @extend_schema(request=None, responses=BudgetAlertSerializer)
    @action(detail=True, methods=["post"])
    def acknowledge(self, request: Request, pk: str | None = None) -> Response:
        alert = budget_alert_acknowledge(alert=self.get_object())
        return Response(self.get_serializer(alert).data)
