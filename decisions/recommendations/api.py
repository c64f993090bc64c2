"""/api/recommendations/: list and read proposals with their evidence; accept or dismiss one.

- GET /api/recommendations/?workflow=<slug>&state=proposed: newest first, any role of the
  workflow's team (a viewer's answer has no money: the figures sit under `cost`, a MONEY_KEYS
  key dropped by registry.auth.costs for callers who may not see costs).
- POST /api/recommendations/<id>/accept/: the new routing-policy version (operators of the
  workflow's team or platform-wide); 409 when decided already or stale.
- POST /api/recommendations/<id>/dismiss/ {"reason": "..."}: 400 {"reason": [...]} without one.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import BaseRouter

from decisions.models import Recommendation
from decisions.recommendations import services
from decisions.recommendations.selectors import (
    recommendation_stale,
    replay_request_ids,
    with_current_policy,
)
from registry.api.fields import ModelSerializer
from registry.api.query_params import query_choice
from registry.auth.roles import ALL_ROLES, OPERATORS


class RecommendationSerializer(ModelSerializer[Recommendation]):
    workflow: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    from_deployment: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    to_deployment: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    policy_version = serializers.IntegerField(
        source="policy_version.version", read_only=True, allow_null=True
    )
    accepted_policy_version = serializers.IntegerField(
        source="accepted_policy_version.version", read_only=True, allow_null=True
    )
    decided_by = serializers.CharField(source="decided_by.get_username", read_only=True, allow_null=True)
    stale = serializers.SerializerMethodField()
    cost = serializers.SerializerMethodField()
    evidence = serializers.SerializerMethodField()
    url = serializers.SerializerMethodField()

    class Meta:
        model = Recommendation
        fields = [
            "id",
            "workflow",
            "kind",
            "state",
            "stale",
            "summary",
            "from_deployment",
            "to_deployment",
            "policy_version",
            "cost_change_percent",
            "quality_before",
            "quality_before_ci",
            "quality_after",
            "quality_after_ci",
            "quality_diff",
            "quality_diff_ci",
            "latency_p95_before_ms",
            "latency_p95_after_ms",
            "latency_p95_delta_ms",
            "replayed_requests",
            "cost",
            "evidence",
            "decided_by",
            "decided_at",
            "dismiss_reason",
            "accepted_policy_version",
            "created_at",
            "url",
        ]
        read_only_fields = fields

    def get_stale(self, obj: Recommendation) -> bool:
        return obj.state == Recommendation.State.PROPOSED and recommendation_stale(recommendation=obj)

    @extend_schema_field(serializers.DictField())
    def get_cost(self, obj: Recommendation) -> dict[str, Any]:
        """Money: the cost per request both sides, the ledger rows' sums and counts, the budgets."""
        return {
            "currency": obj.currency,
            "per_request_before": _text(obj.cost_per_request_before),
            "per_request_after": _text(obj.cost_per_request_after),
            "ledger_before": {"rows": obj.ledger_rows_before, "sum": _text(obj.ledger_amount_before)},
            "ledger_after": {"rows": obj.ledger_rows_after, "sum": _text(obj.ledger_amount_after)},
            "budget_checks": obj.budget_checks,
        }

    @extend_schema_field(serializers.DictField())
    def get_evidence(self, obj: Recommendation) -> dict[str, Any]:
        return {
            "study": obj.study_id,
            "candidate": obj.candidate_id,
            "baseline_candidate": obj.baseline_candidate_id,
            "replayed_request_ids": list(replay_request_ids(candidate=obj.candidate))
            if obj.candidate
            else [],
            "baseline_request_ids": (
                list(replay_request_ids(candidate=obj.baseline_candidate)) if obj.baseline_candidate else []
            ),
            "ledger_subject_type": "inference_request",
            "eval_runs": list(obj.eval_runs.values_list("pk", flat=True)),
        }

    def get_url(self, obj: Recommendation) -> str:
        return services.recommendation_url(recommendation=obj)


# What accept and dismiss answer besides the recommendation: 409 with the reason (FieldErrors'
# shape: {"non_field_errors": [...]}) when it was decided already or its route moved on.
_CONFLICT = OpenApiResponse(OpenApiTypes.OBJECT, description="Decided already, or stale: the route moved on.")


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


class DismissSerializer(serializers.Serializer[Any]):
    reason = serializers.CharField(max_length=500)


@extend_schema_view(
    list=extend_schema(
        parameters=[
            OpenApiParameter("workflow", str, description="only this workflow's (slug)"),
            OpenApiParameter("state", str, enum=Recommendation.State.values, description="only this state"),
        ]
    )
)
class RecommendationViewSet(viewsets.ReadOnlyModelViewSet[Recommendation]):
    """Proposed route changes with their evidence; accepted or dismissed by operators."""

    serializer_class = RecommendationSerializer
    read_roles = ALL_ROLES
    write_roles = OPERATORS
    # Rows belong to their workflow: a team member sees its teams' (another's answers 404), a
    # limited token its workflows', and changing one needs an operator role in its team.
    workflow_field = "workflow"
    query_params_known = ("workflow", "state")

    def get_queryset(self) -> QuerySet[Recommendation]:
        rows = with_current_policy(
            Recommendation.objects.select_related(
                "workflow",
                "from_deployment",
                "to_deployment",
                "policy_version",
                "accepted_policy_version",
                "decided_by",
            )
        )
        slug = self.request.query_params.get("workflow")
        if slug:
            rows = rows.filter(workflow__slug=slug)
        state = query_choice(self.request, "state", Recommendation.State.values)
        if state is not None:
            rows = rows.filter(state=state)
        return rows

    @extend_schema(request=None, responses={200: RecommendationSerializer, 409: _CONFLICT})
    @action(detail=True, methods=["post"])
    def accept(self, request: Request, pk: str | None = None) -> Response:
        """Write the proposal as the workflow's next routing-policy version (409: decided or stale)."""
        rec = services.recommendation_accept(recommendation_id=self.get_object().pk, user=request.user)  # type: ignore[arg-type]
        return Response(self.get_serializer(rec).data)

    @extend_schema(request=DismissSerializer, responses={200: RecommendationSerializer, 409: _CONFLICT})
    @action(detail=True, methods=["post"])
    def dismiss(self, request: Request, pk: str | None = None) -> Response:
        """Close the proposal with a reason (400 without one; 409 when decided already)."""
        rec = self.get_object()
        body = DismissSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        rec = services.recommendation_dismiss(
            recommendation_id=rec.pk,
            user=request.user,  # type: ignore[arg-type]
            reason=body.validated_data["reason"],
        )
        return Response(self.get_serializer(rec).data)


def register(router: BaseRouter) -> None:
    """Mount the decisions API on the project's /api/ router (stack.urls)."""
    router.register("recommendations", RecommendationViewSet, basename="recommendation")
