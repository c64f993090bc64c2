"""Probe jobs and training runs API."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import BaseRouter

from billing.money import ledger_text_or_none
from registry.api.fields import JSONField, ModelSerializer, ResponseSerializer
from registry.auth.principal import can_see_costs
from registry.auth.scoping import request_scope_teams
from registry.models import Cluster
from training.models import ProbeJob, TrainingRun
from training.run_config import RunConfigError
from training.run_selectors import run_learners, run_metrics_payload, run_transitions
from training.selectors import (
    run_cost_per_cluster,
    run_failover_events,
    run_model_versions,
    run_placements,
    run_progress,
)
from training.services import RunStateError, probe_job_create, training_run_cancel, training_run_create


class ProbeJobSerializer(ModelSerializer[ProbeJob]):
    cluster = serializers.SlugRelatedField(slug_field="slug", queryset=Cluster.objects.all())
    created_by = serializers.CharField(
        source="created_by.get_username", read_only=True, default=None, allow_null=True
    )

    class Meta:
        model = ProbeJob
        fields = [
            "id",
            "cluster",
            "steps",
            "status",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
            "attempts",
            "worker_hostname",
            "device",
            "loss_curve",
            "final_loss",
            "accelerator_seconds",
            "error",
        ]
        read_only_fields = [f for f in fields if f not in ("cluster", "steps")]

    def create(self, validated_data: dict[str, Any]) -> ProbeJob:
        return probe_job_create(
            cluster=validated_data["cluster"],
            created_by=self.context["request"].user,
            steps=validated_data.get("steps", 300),
        )


class ProbeJobViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet[ProbeJob]):
    """Short torch jobs dispatched to a cluster's queue."""

    serializer_class = ProbeJobSerializer
    # A probe measures a shared cluster (as its heartbeats do): every team reads the results,
    # platform operators launch probes (their accelerator time is billed to no team).
    shared_with_teams = True
    queryset = ProbeJob.objects.select_related("cluster", "created_by")


# --- Training runs ------------------------------------------------------------------------


class TrainingRunCreateSerializer(serializers.Serializer[TrainingRun]):
    name = serializers.CharField(max_length=128)
    config = JSONField(help_text="The run config (see training.run_config); defaults fill the rest.")


class TrainingRunCancelSerializer(serializers.Serializer[TrainingRun]):
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True)


# --- The schema of the runs' computed fields (documentation only: the views build plain dicts) ---


class RunProgressSerializer(ResponseSerializer):
    """Versions, tokens and eval loss so far, and the cost so far as text."""

    versions = serializers.IntegerField()
    tokens = serializers.IntegerField()
    tokens_merged = serializers.IntegerField()
    eval_loss = serializers.FloatField(allow_null=True)
    cost = serializers.CharField(allow_null=True)
    cost_per_million_tokens = serializers.CharField(allow_null=True)
    cost_per_loss_improvement = serializers.CharField(allow_null=True)


# "from" is a Python keyword, so this one is built from a dict of fields.
_RUN_TRANSITIONS = inline_serializer(
    name="RunTransition",
    many=True,
    fields={
        "from": serializers.CharField(),
        "to": serializers.CharField(),
        "at": serializers.DateTimeField(),
        "reason": serializers.CharField(),
    },
)


class RunLearnerSerializer(ResponseSerializer):
    index = serializers.IntegerField()
    cluster = serializers.CharField(allow_null=True)
    generation = serializers.IntegerField()
    state = serializers.CharField()
    tokens = serializers.IntegerField()
    steps = serializers.IntegerField()
    last_report_at = serializers.DateTimeField(allow_null=True)
    worker_hostname = serializers.CharField()


class RunPlacementSerializer(ResponseSerializer):
    learner_index = serializers.IntegerField()
    generation = serializers.IntegerField()
    cluster = serializers.CharField()
    reason = serializers.CharField()
    unit_price = serializers.CharField(allow_null=True)
    currency = serializers.CharField()
    price_book = serializers.IntegerField(allow_null=True)
    decided_at = serializers.DateTimeField()
    candidates = serializers.JSONField()


class RunClusterCostSerializer(ResponseSerializer):
    cluster = serializers.CharField(allow_null=True)
    unit = serializers.CharField(
        help_text="accelerator_hour (compute) or egress_gb (data moved out of the cluster)"
    )
    amount = serializers.CharField(allow_null=True)
    quantity = serializers.CharField(allow_null=True)


class RunFailoverSerializer(ResponseSerializer):
    id = serializers.IntegerField()
    code = serializers.CharField(help_text="the failover code (registry.failover_codes)")
    subject = serializers.CharField()
    reason = serializers.CharField()
    from_cluster = serializers.CharField(allow_null=True)
    to_cluster = serializers.CharField(allow_null=True)
    detected_at = serializers.DateTimeField()
    recovered_at = serializers.DateTimeField(allow_null=True)
    tokens_lost = serializers.IntegerField(allow_null=True)
    extra_cost = serializers.CharField(allow_null=True)
    currency = serializers.CharField()


class RunModelVersionSerializer(ResponseSerializer):
    """A model version the run registered (every k-th global version, and the final one)."""

    id = serializers.IntegerField()
    ref = serializers.CharField(help_text="<model slug>@<number>: what start_from.model_version takes")
    model = serializers.CharField()
    number = serializers.IntegerField()
    global_version = serializers.IntegerField()
    fragment_versions = serializers.ListField(child=serializers.IntegerField())
    final = serializers.BooleanField()
    eval_loss = serializers.FloatField(allow_null=True)
    tokens = serializers.IntegerField()
    cost = serializers.CharField(allow_null=True, help_text="null unless the caller may read costs")
    currency = serializers.CharField()
    artifact_uri = serializers.CharField()
    layout = serializers.CharField()
    created_at = serializers.DateTimeField()


class RunMetricsSerializer(ResponseSerializer):
    """The run's chart series: published versions, train loss per learner, bytes sent and events."""

    state = serializers.ChoiceField(choices=TrainingRun.State.choices)
    started_at = serializers.DateTimeField(allow_null=True)
    bytes_sent = serializers.IntegerField()
    versions = serializers.ListField(child=serializers.DictField(), help_text="one per published version")
    train_loss = serializers.DictField(help_text="learner index -> {step: [...], loss: [...]}")
    events = serializers.ListField(child=serializers.DictField(), help_text="at, kind, text (and detail)")


class TrainingRunSerializer(ModelSerializer[TrainingRun]):
    created_by = serializers.CharField(
        source="created_by.get_username", read_only=True, default=None, allow_null=True
    )
    registered_model: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    team: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True, help_text="the owning team (the config's team)"
    )
    progress = serializers.SerializerMethodField()

    class Meta:
        model = TrainingRun
        fields = [
            "id",
            "name",
            "team",
            "state",
            "reason",
            "state_changed_at",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
            "money_budget",
            "currency",
            "registered_model",
            "initial_eval_loss",
            "final_eval_loss",
            "progress",
        ]
        read_only_fields = fields

    @extend_schema_field(RunProgressSerializer)
    def get_progress(self, run: TrainingRun) -> dict[str, Any]:
        p = run_progress(run=run)
        return {
            "versions": p.versions,
            "tokens": p.tokens,
            "tokens_merged": p.tokens_merged,
            "eval_loss": p.eval_loss,
            "cost": ledger_text_or_none(p.cost),
            "cost_per_million_tokens": ledger_text_or_none(p.cost_per_million_tokens),
            "cost_per_loss_improvement": ledger_text_or_none(p.cost_per_loss_improvement),
        }


class TrainingRunDetailSerializer(TrainingRunSerializer):
    config = JSONField(read_only=True)
    transitions = serializers.SerializerMethodField()
    learners = serializers.SerializerMethodField()
    placements = serializers.SerializerMethodField()
    cost_per_cluster = serializers.SerializerMethodField()
    failover_events = serializers.SerializerMethodField()
    model_versions = serializers.SerializerMethodField()
    started_from = serializers.SerializerMethodField()

    class Meta(TrainingRunSerializer.Meta):
        fields = [
            *TrainingRunSerializer.Meta.fields,
            "config",
            "artifact_uri",
            "transitions",
            "learners",
            "placements",
            "cost_per_cluster",
            "failover_events",
            "started_from",
            "model_versions",
        ]
        read_only_fields = fields

    def _may_read_costs(self, run: TrainingRun) -> bool:
        request = self.context.get("request")
        return request is not None and can_see_costs(request, run.team_id)

    @extend_schema_field(
        serializers.CharField(allow_null=True, help_text="the model version it started from")
    )
    def get_started_from(self, run: TrainingRun) -> str | None:
        return str(run.started_from) if run.started_from_id else None

    @extend_schema_field(RunModelVersionSerializer(many=True))
    def get_model_versions(self, run: TrainingRun) -> list[dict[str, Any]]:
        costs = self._may_read_costs(run)
        return [
            {
                "id": v.pk,
                "ref": str(v),
                "model": v.registered_model.slug,
                "number": v.number,
                "global_version": v.global_version,
                "fragment_versions": v.fragment_versions,
                "final": v.final,
                "eval_loss": v.eval_loss,
                "tokens": v.tokens,
                "cost": ledger_text_or_none(v.cost) if costs else None,
                "currency": v.currency,
                "artifact_uri": v.artifact_uri,
                "layout": v.layout,
                "created_at": v.created_at.isoformat(),
            }
            for v in run_model_versions(run=run)
        ]

    @extend_schema_field(_RUN_TRANSITIONS)
    def get_transitions(self, run: TrainingRun) -> list[dict[str, Any]]:
        return [
            {"from": t.from_state, "to": t.to_state, "at": t.at.isoformat(), "reason": t.reason}
            for t in run_transitions(run=run)
        ]

    @extend_schema_field(RunLearnerSerializer(many=True))
    def get_learners(self, run: TrainingRun) -> list[dict[str, Any]]:
        return [
            {
                "index": lr.index,
                "cluster": lr.cluster.slug if lr.cluster else None,
                "generation": lr.generation,
                "state": lr.state,
                "tokens": lr.tokens,
                "steps": lr.steps,
                "last_report_at": lr.last_report_at.isoformat() if lr.last_report_at else None,
                "worker_hostname": lr.worker_hostname,
            }
            for lr in run_learners(run=run)
        ]

    @extend_schema_field(RunPlacementSerializer(many=True))
    def get_placements(self, run: TrainingRun) -> list[dict[str, Any]]:
        return [
            {
                "learner_index": p.learner_index,
                "generation": p.generation,
                "cluster": p.cluster.slug,
                "reason": p.reason,
                "unit_price": ledger_text_or_none(p.unit_price),
                "currency": p.currency,
                "price_book": p.price_book_id,
                "decided_at": p.decided_at.isoformat(),
                "candidates": p.candidates,
            }
            for p in run_placements(run=run)
        ]

    @extend_schema_field(RunClusterCostSerializer(many=True))
    def get_cost_per_cluster(self, run: TrainingRun) -> list[dict[str, Any]]:
        return [
            {
                "cluster": r["cluster"],
                "unit": r["unit"],
                "amount": ledger_text_or_none(r["amount"]),
                "quantity": ledger_text_or_none(r["quantity"]),
            }
            for r in run_cost_per_cluster(run=run)
        ]

    @extend_schema_field(RunFailoverSerializer(many=True))
    def get_failover_events(self, run: TrainingRun) -> list[dict[str, Any]]:
        return [
            {
                "id": f.pk,
                "code": f.code,
                "subject": f.subject,
                "reason": f.reason,
                "from_cluster": f.from_cluster.slug if f.from_cluster else None,
                "to_cluster": f.to_cluster.slug if f.to_cluster else None,
                "detected_at": f.detected_at.isoformat(),
                "recovered_at": f.recovered_at.isoformat() if f.recovered_at else None,
                "tokens_lost": f.tokens_lost,
                "extra_cost": ledger_text_or_none(f.extra_cost),
                "currency": f.currency,
            }
            for f in run_failover_events(run=run).order_by("detected_at", "id")
        ]


class TrainingRunViewSet(viewsets.ReadOnlyModelViewSet[TrainingRun]):
    """Multi-cluster DiLoCo training runs: viewers read; operators launch and cancel."""

    queryset = TrainingRun.objects.select_related(
        "created_by", "registered_model", "started_from__registered_model", "team"
    ).order_by("-created_at")
    # A run, and all that hangs off it in its detail and metrics (learners, chunks, placements,
    # checkpoints, model versions, failovers, costs), belongs to the run's team.
    team_field = "team"

    def get_serializer_class(self) -> type[serializers.BaseSerializer[Any]]:
        if self.action == "create":
            return TrainingRunCreateSerializer
        if self.action == "cancel":
            return TrainingRunCancelSerializer
        if self.action == "retrieve":
            return TrainingRunDetailSerializer
        return TrainingRunSerializer

    @extend_schema(request=TrainingRunCreateSerializer, responses={201: TrainingRunDetailSerializer})
    def create(self, request: Request) -> Response:
        data = TrainingRunCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            run = training_run_create(
                config=data.validated_data["config"],
                created_by=request.user,  # type: ignore[arg-type]
                name=data.validated_data["name"],
                # A team-scoped caller launches runs in the teams where it may write only.
                teams=request_scope_teams(request),
            )
        except RunConfigError as exc:
            raise ValidationError(exc.errors) from exc
        body = TrainingRunDetailSerializer(run, context=self.get_serializer_context()).data
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=TrainingRunCancelSerializer, responses={200: TrainingRunDetailSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        data = TrainingRunCancelSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            training_run_cancel(run=run, reason=data.validated_data.get("reason", ""), by=request.user)  # type: ignore[arg-type]
        except RunStateError as exc:
            raise ValidationError({"state": [str(exc)]}) from exc
        run.refresh_from_db()
        return Response(TrainingRunDetailSerializer(run, context=self.get_serializer_context()).data)

    @extend_schema(responses={200: RunMetricsSerializer})
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, pk: str | None = None) -> Response:
        # Money leaves also the timeline's sentences for a caller who may not see costs.
        run = self.get_object()
        return Response(run_metrics_payload(run=run, costs=can_see_costs(request, run.team_id)))


def register(router: BaseRouter) -> None:
    """Add this app's viewsets to the /api/ router."""
    router.register("probe-jobs", ProbeJobViewSet)
    router.register("training-runs", TrainingRunViewSet)
