"""The inference app's /api/ endpoints: serializers and viewsets, and `register(router)`.

- /api/chaos/<deployment-slug>/: a deployment's fault injection for failover drills. GET lists
  every deployment's settings (any role); PUT/PATCH changes one (operators) through
  inference.services.chaos_config_set, so the next routed request sees it.
- /api/eval-sets/, /api/eval-runs/, /api/feedback/: quality scores for deployments. Eval sets
  and runs: any role reads, operators write. POST /api/eval-sets/<id>/cases/ adds a case (a bad
  regex or schema answers 400 naming the field). POST /api/eval-runs/ {eval_set, deployment}
  queues a run (201). POST /api/feedback/ records an application's score for a request or a
  deployment (201 with the QualityRecord). The work is in inference.quality.services.
- /api/batch-jobs/: create (operators), list and detail with progress (any role). POST
  {workflow, input_uri} (a key in the object store) or {workflow, input_jsonl} (the JSONL text,
  stored for the job); a bad line answers 400 naming the line. POST .../<id>/cancel/ stops a
  pending or running job (400 when it has finished). The work is in inference.batch.jobs.

The /v1 gateway is plain Django views (inference.gateway.views); the pages are inference.views.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from django.utils.datastructures import MultiValueDict
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import BaseRouter

from inference.batch import jobs as batch
from inference.batch.selectors import batch_job_progress, batch_jobs
from inference.models import (
    BatchJob,
    ChaosConfig,
    EvalCase,
    EvalRun,
    EvalSet,
    InferenceRequest,
    QualityRecord,
)
from inference.quality import services as quality
from inference.services import chaos_config_set
from registry.api.fields import FloatField, IntegerField, JSONField, ModelSerializer, ResponseSerializer
from registry.api.workflow_rows import WorkflowRowViewSet
from registry.auth.access import request_token
from registry.auth.roles import ALL_ROLES, OPERATORS
from registry.auth.scoping import (
    WorkflowScopedPrimaryKeyRelatedField,
    request_scope_teams,
    scope_requires_team_workflow,
    scope_requires_workflow,
    scoped_workflow_field,
)
from registry.models import Deployment, Workflow
from registry.validation import INTEGER_MAX, id_parse

# --- Chaos drills ------------------------------------------------------------------------------


class ChaosSerializer(serializers.Serializer[Any]):
    deployment = serializers.CharField(read_only=True)
    enabled = serializers.BooleanField()
    error_rate = FloatField(min_value=0.0, max_value=1.0, default=0.0)
    status_codes = serializers.ListField(
        child=IntegerField(min_value=100, max_value=599), default=list, max_length=10
    )
    latency_ms = IntegerField(min_value=0, max_value=600_000, default=0)
    malformed_rate = FloatField(min_value=0.0, max_value=1.0, default=0.0)
    updated_at = serializers.DateTimeField(read_only=True, allow_null=True)  # null: never configured


def _chaos_doc(deployment: Deployment, config: ChaosConfig | None) -> dict[str, Any]:
    return {
        "deployment": deployment.slug,
        "enabled": bool(config and config.enabled),
        "error_rate": config.error_rate if config else 0.0,
        "status_codes": list(config.status_codes) if config else [],
        "latency_ms": config.latency_ms if config else 0,
        "malformed_rate": config.malformed_rate if config else 0.0,
        "updated_at": config.updated_at if config else None,
    }


# A plain ViewSet has no queryset for drf-spectacular to type the path from: the deployment's slug.
_DEPLOYMENT_SLUG = OpenApiParameter("slug", str, OpenApiParameter.PATH, description="a deployment's slug")


@extend_schema_view(
    retrieve=extend_schema(parameters=[_DEPLOYMENT_SLUG]),
    update=extend_schema(parameters=[_DEPLOYMENT_SLUG]),
    partial_update=extend_schema(parameters=[_DEPLOYMENT_SLUG]),
)
class ChaosViewSet(viewsets.ViewSet):
    lookup_field = "slug"
    serializer_class = ChaosSerializer
    # A deployment's faults hit every team's workflows that route to it: team members read the
    # drill settings, platform operators change them.
    shared_with_teams = True

    def list(self, request: Request) -> Response:
        configs = {c.deployment_id: c for c in ChaosConfig.objects.all()}
        docs = [_chaos_doc(d, configs.get(d.pk)) for d in Deployment.objects.order_by("slug")]
        return Response(ChaosSerializer(docs, many=True).data)

    def retrieve(self, request: Request, slug: str | None = None) -> Response:
        deployment = get_object_or_404(Deployment, slug=slug)
        config = ChaosConfig.objects.filter(deployment=deployment).first()
        return Response(ChaosSerializer(_chaos_doc(deployment, config)).data)

    def update(self, request: Request, slug: str | None = None) -> Response:
        deployment = get_object_or_404(Deployment, slug=slug)
        return _chaos_apply(request, deployment, request.data)

    def partial_update(self, request: Request, slug: str | None = None) -> Response:
        """PATCH: PUT over the current settings."""
        deployment = get_object_or_404(Deployment, slug=slug)
        current = _chaos_doc(deployment, ChaosConfig.objects.filter(deployment=deployment).first())
        merged = {k: v for k, v in current.items() if k not in ("deployment", "updated_at")}
        # A form body is a QueryDict: its .dict() holds one value per field, as JSON would.
        merged.update(request.data.dict() if isinstance(request.data, MultiValueDict) else request.data)
        return _chaos_apply(request, deployment, merged)


def _chaos_apply(request: Request, deployment: Deployment, raw: Any) -> Response:
    body = ChaosSerializer(data=raw)
    body.is_valid(raise_exception=True)
    data = body.validated_data
    config = chaos_config_set(
        deployment=deployment,
        enabled=data["enabled"],
        user=request.user,  # type: ignore[arg-type]
        error_rate=data["error_rate"],
        status_codes=data["status_codes"],
        latency_ms=data["latency_ms"],
        malformed_rate=data["malformed_rate"],
    )
    return Response(ChaosSerializer(_chaos_doc(deployment, config)).data)


# --- Eval sets, eval runs and feedback -----------------------------------------------------------


class EvalCaseSerializer(ModelSerializer[EvalCase]):
    judge_deployment = serializers.SlugRelatedField(
        slug_field="slug", queryset=Deployment.objects.all(), required=False, allow_null=True
    )
    scorer_config = JSONField(required=False, default=dict)
    position = IntegerField(min_value=0, max_value=INTEGER_MAX, required=False)  # EvalCase.position

    class Meta:
        model = EvalCase
        fields = ["id", "position", "prompt", "expected", "scorer", "scorer_config", "judge_deployment"]
        read_only_fields = ["id"]


class EvalSetSerializer(ModelSerializer[EvalSet]):
    workflow = scoped_workflow_field()
    cases = EvalCaseSerializer(many=True, required=False)

    class Meta:
        model = EvalSet
        fields = ["id", "workflow", "name", "description", "schedule_enabled", "cases", "created_at"]
        read_only_fields = ["id", "created_at"]
        validators: list[Any] = []  # the service names the duplicate-name error on its field


class EvalRunSerializer(ModelSerializer[EvalRun]):
    eval_set = WorkflowScopedPrimaryKeyRelatedField(queryset=EvalSet.objects.all())
    deployment = serializers.SlugRelatedField(slug_field="slug", queryset=Deployment.objects.all())

    class Meta:
        model = EvalRun
        fields = [
            "id",
            "eval_set",
            "deployment",
            "state",
            "trigger",
            "cases_total",
            "cases_done",
            "mean_score",
            "cost",
            "error",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = [f for f in fields if f not in ("eval_set", "deployment")]


class EvalSetViewSet(WorkflowRowViewSet[EvalSet]):
    """Eval sets: a workflow's cases, scored against its deployments (any role reads, operators write)."""

    queryset = EvalSet.objects.select_related("workflow").prefetch_related("cases__judge_deployment")
    serializer_class = EvalSetSerializer

    def create_row(self, data: dict[str, Any]) -> EvalSet:
        return quality.eval_set_create(
            workflow=data["workflow"],
            name=data["name"],
            description=data.get("description", ""),
            schedule_enabled=data.get("schedule_enabled", False),
            cases=[dict(c) for c in data.get("cases", [])],
            user=self.request.user,  # type: ignore[arg-type]
        )

    @extend_schema(request=EvalCaseSerializer, responses={201: EvalCaseSerializer})
    @action(detail=True, methods=["post"], serializer_class=EvalCaseSerializer)
    def cases(self, request: Request, pk: str | None = None) -> Response:
        eval_set = self.get_object()  # DRF's lookup: a malformed or unknown id is a 404
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        case = quality.eval_case_create(eval_set=eval_set, **body.validated_data)
        return Response(self.get_serializer(case).data, status=status.HTTP_201_CREATED)


@extend_schema_view(
    list=extend_schema(parameters=[OpenApiParameter("eval_set", str, description="an eval set's id")])
)
class EvalRunViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet[EvalRun],
):
    read_roles = ALL_ROLES
    write_roles = OPERATORS
    serializer_class = EvalRunSerializer
    query_params_known = ("eval_set",)
    workflow_field = "eval_set__workflow"

    def get_queryset(self) -> Any:
        qs = EvalRun.objects.select_related("deployment")
        eval_set = self.request.query_params.get("eval_set")
        if eval_set:
            eval_set_id = id_parse(eval_set)
            if eval_set_id is None:
                raise serializers.ValidationError({"eval_set": ["an eval set's id: a whole number"]})
            qs = qs.filter(eval_set_id=eval_set_id)
        return qs

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = quality.eval_run_start(
            eval_set=body.validated_data["eval_set"],
            deployment=body.validated_data["deployment"],
            user=request.user,  # type: ignore[arg-type]
            api_key=request_token(request),
        )
        return Response(self.get_serializer(run).data, status=status.HTTP_201_CREATED)


class FeedbackSerializer(serializers.Serializer[Any]):
    request_id = WorkflowScopedPrimaryKeyRelatedField(
        queryset=InferenceRequest.objects.select_related("deployment", "workflow"), required=False
    )
    deployment = serializers.SlugRelatedField(
        slug_field="slug", queryset=Deployment.objects.all(), required=False
    )
    workflow = scoped_workflow_field(required=False)
    # A float: applications send whatever their arithmetic produced (0.30000000000000004);
    # the service rounds it to the record's four places.
    score = FloatField(min_value=0.0, max_value=1.0)
    comment = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        request = attrs.get("request_id")
        if request is None and attrs.get("deployment") is None:
            raise serializers.ValidationError(
                {"deployment": ["give request_id, or deployment (and workflow)"]}
            )
        if request is None:
            # A score for a bare deployment moves its quality for every workflow (every team's).
            scope_requires_workflow(self.context["request"], attrs.get("workflow"))
            scope_requires_team_workflow(self.context["request"], attrs.get("workflow"))
        if request is not None:
            for name, value in (("deployment", request.deployment), ("workflow", request.workflow)):
                given = attrs.get(name)
                if given is not None and given != value:
                    raise serializers.ValidationError(
                        {name: [f"request {request.pk} was not served by {given.slug}"]}
                    )
        return attrs


class QualityRecordSerializer(ModelSerializer[QualityRecord]):
    deployment: serializers.SlugRelatedField[Deployment] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    workflow: serializers.SlugRelatedField[Workflow] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    request_id = serializers.IntegerField(source="inference_request_id", read_only=True, allow_null=True)

    class Meta:
        model = QualityRecord
        fields = ["id", "deployment", "workflow", "source", "score", "request_id", "comment", "created_at"]
        read_only_fields = fields


class FeedbackViewSet(viewsets.GenericViewSet[QualityRecord]):
    read_roles = ALL_ROLES
    write_roles = OPERATORS
    serializer_class = FeedbackSerializer
    workflow_field = "workflow"  # its inputs name a request or a workflow the token reaches

    @extend_schema(request=FeedbackSerializer, responses={201: QualityRecordSerializer})
    def create(self, request: Request) -> Response:
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        record = quality.feedback_record(
            score=data["score"],
            inference_request=data.get("request_id"),
            deployment=data.get("deployment"),
            workflow=data.get("workflow"),
            comment=data.get("comment", ""),
        )
        return Response(QualityRecordSerializer(record).data, status=status.HTTP_201_CREATED)


# --- Batch jobs ----------------------------------------------------------------------------------


# The schema of BatchJobSerializer.get_progress (documentation only).
class BatchProgressSerializer(ResponseSerializer):
    """How far the job is: lines done and failed, the fraction finished, the cost so far as text."""

    state = serializers.ChoiceField(choices=BatchJob.State.choices)
    total = serializers.IntegerField()
    done = serializers.IntegerField()
    failed = serializers.IntegerField()
    remaining = serializers.IntegerField()
    fraction = serializers.FloatField()
    cost = serializers.CharField()


class BatchJobSerializer(ModelSerializer[BatchJob]):
    workflow = scoped_workflow_field()
    input_uri = serializers.CharField(max_length=512, required=False, allow_blank=True, default="")
    input_jsonl = serializers.CharField(required=False, write_only=True, trim_whitespace=False)
    created_by = serializers.CharField(source="created_by.username", read_only=True)
    progress = serializers.SerializerMethodField()

    class Meta:
        model = BatchJob
        fields = [
            "id",
            "workflow",
            "input_uri",
            "input_jsonl",
            "output_uri",
            "state",
            "total",
            "done",
            "failed",
            "cost",
            "progress",
            "error",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = [f for f in fields if f not in ("workflow", "input_uri", "input_jsonl")]

    @extend_schema_field(BatchProgressSerializer)
    def get_progress(self, job: BatchJob) -> dict[str, Any]:
        progress = batch_job_progress(job=job)
        progress["cost"] = str(progress["cost"])
        return progress


class BatchJobViewSet(WorkflowRowViewSet[BatchJob]):
    """Batch jobs: a workflow's JSONL of requests, run line by line (any role reads, operators write)."""

    queryset = batch_jobs()
    serializer_class = BatchJobSerializer

    def create_row(self, data: dict[str, Any]) -> BatchJob:
        return batch.batch_job_create(
            workflow=data["workflow"],
            user=self.request.user,  # type: ignore[arg-type]
            input_uri=data.get("input_uri", ""),
            input_jsonl=data.get("input_jsonl"),
            api_key=request_token(self.request),
            # A team-scoped caller names keys of the workflow's team only.
            teams=request_scope_teams(self.request, self.write_roles),
        )

    @extend_schema(request=None, responses=BatchJobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        job = batch.batch_job_cancel(job=self.get_object())  # a malformed or unknown id is a 404
        return Response(self.get_serializer(job).data)


def register(router: BaseRouter) -> None:
    """Mount inference's viewsets on the project's /api/ router (stack.urls)."""
    router.register("chaos", ChaosViewSet, basename="chaos")
    router.register("eval-sets", EvalSetViewSet, basename="eval-set")
    router.register("eval-runs", EvalRunViewSet, basename="eval-run")
    router.register("feedback", FeedbackViewSet, basename="feedback")
    router.register("batch-jobs", BatchJobViewSet, basename="batch-job")
