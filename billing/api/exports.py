"""Exports' API: /api/usage-export/ streams the ledger in FOCUS columns; /api/export-jobs/ runs jobs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import QuerySet
from django.http import HttpResponseBase
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.downloads import export_job_file_response, export_response
from billing.exports import (
    FORMATS,
    ExportFilterError,
    ExportFilters,
    export_filters_parse,
    export_job_create,
    export_job_file_names,
    export_jobs_of_teams,
)
from billing.models import ExportJob, Unit
from registry.api.fields import ModelSerializer, RefuseUnknownFields, ResponseSerializer
from registry.auth.roles import LEDGER_READERS, Role
from registry.auth.scoping import LIMITED_TOKEN_MESSAGE, visible_workflow_slugs
from registry.auth.teams import request_teams_with_role, team_slugs
from registry.models import Workflow


class _FormatIsAFilter(DefaultContentNegotiation):
    """`?format=csv` chooses the export's format here, not one of DRF's renderers."""

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type


# The query: `format` and the filters of billing.exports.FILTER_FIELDS (unknown names are refused).
_EXPORT_PARAMETERS = [
    OpenApiParameter("format", str, enum=list(FORMATS), description="the file format (default csv)"),
    OpenApiParameter("start", str, description="UTC, inclusive: 2026-05-01 or 2026-05-01T00:00:00Z"),
    OpenApiParameter("end", str, description="UTC, exclusive"),
    OpenApiParameter("provider", str, description="a provider's slug"),
    OpenApiParameter("cluster", str, description="a cluster's slug"),
    OpenApiParameter("workflow", str, description="a workflow's slug"),
    OpenApiParameter("team", str),
    OpenApiParameter("api_key", str, description="an API key's prefix"),
    OpenApiParameter("training_run", str, description="a training run's id"),
    OpenApiParameter("unit", str, enum=Unit.values),
    OpenApiParameter(
        "partition", str, description="one ledger partition (default: every partition, by time)"
    ),
]


class UsageExportView(APIView):
    """GET /api/usage-export/?format=csv|jsonl|parquet&start=&end=&provider=&cluster=&workflow=&team=&api_key=&training_run=&unit=&partition=

    The ledger rows in FOCUS-style columns, streamed. Ledger readers only.
    """

    read_roles = LEDGER_READERS
    renderer_classes = [JSONRenderer]
    content_negotiation_class = _FormatIsAFilter
    workflow_field = "workflow"  # a token limited to workflows exports one of them at a time

    @extend_schema(
        operation_id="usage_export",
        parameters=_EXPORT_PARAMETERS,
        responses={
            (200, "text/csv"): OpenApiTypes.STR,
            (200, "application/x-ndjson"): OpenApiTypes.STR,
            (200, "application/vnd.apache.parquet"): OpenApiTypes.BINARY,
        },
    )
    def get(self, request: Request) -> HttpResponseBase:
        params = {key: request.query_params.get(key) for key in request.query_params}
        fmt = params.get("format") or "csv"
        errors: dict[str, list[str]] = {}
        if fmt not in FORMATS:
            errors["format"] = [f"unknown format {fmt!r}; one of {', '.join(FORMATS)}"]
        try:
            filters = export_filters_parse(params=params, ignore=("format",))
            errors.update(_scope_errors(request, filters))
        except ExportFilterError as exc:
            errors.update(exc.errors)
        if errors:
            return Response(errors, status=status.HTTP_400_BAD_REQUEST)
        return export_response(filters=_scoped(request, filters, self.read_roles), fmt=fmt)


def _ledger_teams(request: Request, roles: frozenset[Role]) -> frozenset[int] | None:
    """The teams whose ledger rows this request may export: those where it holds one of
    `roles` (a viewer of a team reads none of its money); None: every row."""
    return request_teams_with_role(request, roles)


def _scope_errors(
    request: Request, filters: ExportFilters, roles: frozenset[Role] = LEDGER_READERS
) -> dict[str, list[str]]:
    """A token limited to workflows exports the rows of one of its workflows, named in the
    filters; a team-scoped caller the rows of its teams, and a team or workflow filter naming
    another team's reads as one that does not exist."""
    errors: dict[str, list[str]] = {}
    teams = _ledger_teams(request, roles)
    if teams is not None:
        if filters.team and filters.team not in (team_slugs(teams) or ()):
            errors["team"] = [f"no team {filters.team}"]
        if filters.workflow and not Workflow.objects.filter(slug=filters.workflow, team__in=teams).exists():
            errors["workflow"] = [f"no workflow with slug {filters.workflow}"]
    slugs = visible_workflow_slugs(request)
    if slugs is None:
        return errors
    if not filters.workflow:
        errors["workflow"] = [f"{LIMITED_TOKEN_MESSAGE}: name one of them"]
    elif filters.workflow not in slugs:
        errors["workflow"] = [f"no workflow with slug {filters.workflow}"]
    return errors


def _scoped(request: Request, filters: ExportFilters, roles: frozenset[Role]) -> ExportFilters:
    """`filters` limited to the rows of the caller's teams (for both writers: the Python rows
    and PostgreSQL's COPY read ExportFilters.teams)."""
    return filters.for_teams(team_slugs(_ledger_teams(request, roles)))


# The schema of ExportJobSerializer.get_files (documentation only).
class ExportFileSerializer(ResponseSerializer):
    """One of the job's files: its name and where to download it."""

    name = serializers.CharField()
    url = serializers.CharField()


class ExportJobSerializer(RefuseUnknownFields, ModelSerializer[ExportJob]):
    """An export job; a field it does not know (a filter given beside `filters`, or
    `filters[provider]` in a form) is refused rather than dropped: dropping it would export
    more than was asked."""

    filters = serializers.DictField(required=False, default=dict)
    formats = serializers.ListField(child=serializers.CharField(), required=False, default=list(FORMATS))
    created_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username",
        read_only=True,
        allow_null=True,  # null once the user is deleted
    )
    files = serializers.SerializerMethodField()
    page = serializers.SerializerMethodField()

    class Meta:
        model = ExportJob
        fields = [
            "id",
            "status",
            "created_at",
            "created_by",
            "filters",
            "formats",
            "started_at",
            "finished_at",
            "row_count",
            "manifest",
            "error",
            "files",
            "page",
        ]
        read_only_fields = [f for f in fields if f not in ("filters", "formats")]

    def validate_filters(self, value: dict[str, Any]) -> ExportFilters:
        try:
            filters = export_filters_parse(params=value)
        except ExportFilterError as exc:
            raise serializers.ValidationError(exc.errors) from None
        errors = _scope_errors(self.context["request"], filters)
        if errors:
            raise serializers.ValidationError(errors)
        return filters

    def validate_formats(self, value: list[str]) -> list[str]:
        if not value:
            raise serializers.ValidationError(f"choose at least one of {', '.join(FORMATS)}")
        bad = [f for f in value if f not in FORMATS]
        if bad:
            raise serializers.ValidationError(f"unknown format {bad[0]!r}; one of {', '.join(FORMATS)}")
        return value

    def to_representation(self, instance: ExportJob) -> dict[str, Any]:
        data: dict[str, Any] = super().to_representation(instance)
        data["filters"], data["formats"] = instance.filters, instance.formats
        return data

    @extend_schema_field(ExportFileSerializer(many=True))
    def get_files(self, job: ExportJob) -> list[dict[str, str]]:
        return [
            # The API's own download (a token reaches it; the page's link wants a session).
            {"name": name, "url": reverse("exportjob-file", args=[job.pk, name])}
            for name in export_job_file_names(job)
        ]

    def get_page(self, job: ExportJob) -> str:
        return reverse("billing-export-job", args=[job.pk])

    def create(self, validated_data: dict[str, Any]) -> ExportJob:
        request = self.context["request"]
        roles = frozenset(getattr(self.context.get("view"), "write_roles", LEDGER_READERS))
        return export_job_create(
            created_by=request.user,
            filters=_scoped(request, validated_data.get("filters") or ExportFilters(), roles),
            formats=validated_data["formats"],
        )


class ExportJobViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet[ExportJob]):
    """Export jobs: files plus a signed manifest in the object store (ledger readers)."""

    serializer_class = ExportJobSerializer
    read_roles = write_roles = LEDGER_READERS
    queryset = ExportJob.objects.select_related("created_by")

    def team_scope_queryset(
        self, queryset: QuerySet[ExportJob], teams: frozenset[int]
    ) -> QuerySet[ExportJob]:
        """A team-scoped caller sees the jobs limited to its teams' rows (ExportJob.teams, all
        of them among the caller's); a job of every row, or of no team, is the platform's."""
        return export_jobs_of_teams(queryset, teams)

    def workflow_scope_queryset(self, queryset: QuerySet[ExportJob], request: Request) -> QuerySet[ExportJob]:
        """A token limited to workflows sees the exports of those workflows (WorkflowScopeFilter)."""
        return queryset.filter(filters__workflow__in=sorted(visible_workflow_slugs(request) or ()))

    @extend_schema(
        operation_id="export_jobs_file",
        parameters=[
            OpenApiParameter("name", str, OpenApiParameter.PATH, description="a file's name, from `files`")
        ],
        responses={
            (200, "text/csv"): OpenApiTypes.STR,
            (200, "application/x-ndjson"): OpenApiTypes.STR,
            (200, "application/vnd.apache.parquet"): OpenApiTypes.BINARY,
            (200, "application/json"): OpenApiTypes.OBJECT,
        },
    )
    @action(
        detail=True,
        methods=["get"],
        url_path=r"files/(?P<name>[^/]+)",
        content_negotiation_class=_FormatIsAFilter,
    )
    def file(self, request: Request, pk: str | None = None, name: str = "") -> HttpResponseBase:
        """GET /api/export-jobs/{id}/files/{name}/: one of the job's files (as `files[].url` names it),
        streamed from the object store, for the callers who may read the job."""
        job = self.get_object()
        try:
            return export_job_file_response(job=job, name=name)
        except LookupError:
            raise NotFound(f"export #{job.pk} has no file {name}") from None
