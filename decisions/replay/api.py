"""/api/replay-studies/: counterfactual routing studies (create, list, get), scoped through their
workflow: a team member sees its teams' studies (another team's answers 404), operators of the
workflow's team create them."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema as schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import BaseRouter

from decisions.models import ReplayCandidate, ReplayResult, ReplayStudy
from decisions.models.replay import MAX_REPLAY_SAMPLE
from decisions.replay import services as replay
from inference.models import EvalCase
from registry.api.fields import IntegerField, JSONField, ModelSerializer
from registry.api.workflow_rows import WorkflowRowViewSet
from registry.auth.access import request_token
from registry.auth.scoping import scoped_workflow_field
from registry.models import Deployment


class ReplayCandidateSerializer(ModelSerializer[ReplayCandidate]):
    deployment: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    batch_job: serializers.PrimaryKeyRelatedField[Any] = serializers.PrimaryKeyRelatedField(read_only=True)

    class Meta:
        model = ReplayCandidate
        fields = [
            "id",
            "deployment",
            "batch_job",
            "requests",
            "succeeded",
            "cost_total",
            "currency",
            "cost_per_request",
            "cost_per_request_ci",
            "cost_per_1m_requests",
            "quality_mean",
            "quality_ci",
            "latency_p50_ms",
            "latency_p95_ms",
            "latency_p95_ci_ms",
            "judge_cost_total",
            "paired_requests",
            "cost_delta_per_request",
            "cost_delta_ci",
            "quality_delta",
            "quality_delta_ci",
        ]
        read_only_fields = fields


class ReplayResultSerializer(ModelSerializer[ReplayResult]):
    """One kept request replayed on one candidate: the evidence rows (never the prompt)."""

    deployment = serializers.CharField(source="candidate.deployment.slug", read_only=True)

    class Meta:
        model = ReplayResult
        fields = [
            "id",
            "candidate",
            "deployment",
            "original_request",
            "replay_request",
            "ok",
            "score",
            "cost",
            "latency_ms",
            "judge_request",
            "judge_cost",
            "error",
            "created_at",
        ]
        read_only_fields = fields


class ReplayStudySerializer(ModelSerializer[ReplayStudy]):
    workflow = scoped_workflow_field()
    deployments = serializers.SlugRelatedField(
        slug_field="slug", queryset=Deployment.objects.select_related("provider"), many=True, write_only=True
    )
    judge_deployment = serializers.SlugRelatedField(
        slug_field="slug",
        queryset=Deployment.objects.select_related("provider"),
        required=False,
        allow_null=True,
    )
    baseline_deployment: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    sample_size = IntegerField(min_value=1, max_value=MAX_REPLAY_SAMPLE, default=100)
    max_rpm = IntegerField(min_value=1, max_value=1_000_000, required=False, allow_null=True)
    scorer = serializers.ChoiceField(choices=EvalCase.Scorer.choices, default=EvalCase.Scorer.EXACT)
    scorer_config = JSONField(required=False, default=dict)
    include_baseline = serializers.BooleanField(default=True, write_only=True)
    candidates = ReplayCandidateSerializer(many=True, read_only=True)

    class Meta:
        model = ReplayStudy
        fields = [
            "id",
            "workflow",
            "deployments",
            "include_baseline",
            "policy_version",
            "baseline_deployment",
            "sample_size",
            "sampled_since",
            "scorer",
            "scorer_config",
            "judge_deployment",
            "max_rpm",
            "state",
            "error",
            "sampled_request_ids",
            "candidates",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = [
            "id",
            "policy_version",
            "state",
            "error",
            "sampled_request_ids",
            "created_at",
            "started_at",
            "finished_at",
        ]

    def validate_deployments(self, value: list[Deployment]) -> list[Deployment]:
        if not value:
            raise serializers.ValidationError("name at least one candidate deployment")
        return value


class ReplayStudyViewSet(WorkflowRowViewSet[ReplayStudy]):
    """Replay studies: a workflow's kept requests replayed through candidate deployments."""

    queryset = ReplayStudy.objects.select_related(
        "workflow", "baseline_deployment", "judge_deployment"
    ).prefetch_related("candidates__deployment")
    serializer_class = ReplayStudySerializer

    def create_row(self, data: dict[str, Any]) -> ReplayStudy:
        return replay.replay_study_create(
            workflow=data["workflow"],
            deployments=data["deployments"],
            user=self.request.user,  # type: ignore[arg-type]
            sample_size=data["sample_size"],
            scorer=data["scorer"],
            scorer_config=data.get("scorer_config") or {},
            judge_deployment=data.get("judge_deployment"),
            max_rpm=data.get("max_rpm"),
            sampled_since=data.get("sampled_since"),
            include_baseline=data["include_baseline"],
            api_key=request_token(self.request),
        )

    @schema(responses=ReplayResultSerializer(many=True))
    @action(detail=True, methods=["get"], serializer_class=ReplayResultSerializer)
    def results(self, request: Request, pk: str | None = None) -> Response:
        """The study's per-request results (paginated), each pointing at its ledger evidence:
        the replayed request and the judge's request (their usage records)."""
        study = self.get_object()  # another team's study is a 404
        rows = ReplayResult.objects.filter(candidate__study=study).select_related("candidate__deployment")
        page = self.paginate_queryset(rows.order_by("candidate_id", "id"))  # type: ignore[arg-type]
        return self.get_paginated_response(ReplayResultSerializer(page, many=True).data)


def register(router: BaseRouter) -> None:
    """Mount the decisions viewsets on the project's /api/ router (stack.urls)."""
    router.register("replay-studies", ReplayStudyViewSet, basename="replay-study")
