"""Cost-audit exports over HTTP: the export page, export-job pages, and their API.

Streaming choice: CSV and JSON Lines stream straight from the ledger cursor
(StreamingHttpResponse, constant memory). Parquet writes its footer last, so a
direct Parquet download is written to an anonymous temporary file first and
then streamed from disk (FileResponse); export jobs write all three formats.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import forms
from django.http import (
    FileResponse,
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseRedirect,
    StreamingHttpResponse,
)
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils.http import content_disposition_header
from django.views import View
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.exports import (
    CONTENT_TYPES,
    FORMATS,
    MANIFEST_NAME,
    ExportFilterError,
    ExportFilterForm,
    ExportFilters,
    export_filters_parse,
    export_job_create,
    export_job_file_chunks,
    export_job_file_names,
    export_parquet_tempfile,
    export_stream,
)
from billing.models import ExportJob
from stack.registry.roles import LEDGER_READERS
from stack.registry.views import RoleRequiredMixin

FORMAT_LABELS = {"csv": "CSV", "jsonl": "JSON Lines", "parquet": "Parquet"}


def _attachment(filename: str) -> str:
    return content_disposition_header(True, filename) or "attachment"


def export_response(*, filters: ExportFilters, fmt: str) -> HttpResponseBase:
    """The export as a download: streamed (CSV, JSON Lines) or from a temp file (Parquet)."""
    filename = f"{filters.file_stem()}.{fmt}"
    if fmt == "parquet":
        return FileResponse(
            export_parquet_tempfile(filters=filters),
            as_attachment=True,
            filename=filename,
            content_type=CONTENT_TYPES["parquet"],
        )
    response = StreamingHttpResponse(export_stream(filters=filters, fmt=fmt), content_type=CONTENT_TYPES[fmt])
    response["Content-Disposition"] = _attachment(filename)
    return response


# --- Pages ----------------------------------------------------------------------------------------


class ExportPageForm(ExportFilterForm):
    format = forms.ChoiceField(
        choices=[(f, FORMAT_LABELS[f]) for f in FORMATS], initial="csv", widget=forms.RadioSelect
    )


class ExportPageView(RoleRequiredMixin, View):
    """Pick a period and filters; download now, or run an export job to the object store."""

    read_roles = write_roles = LEDGER_READERS

    def get(self, request: HttpRequest) -> HttpResponse:
        return self._page(request, ExportPageForm())

    def post(self, request: HttpRequest) -> HttpResponseBase:
        form = ExportPageForm(request.POST)
        if not form.is_valid():
            return self._page(request, form, status=400)
        if request.POST.get("action") == "job":
            job = export_job_create(created_by=request.user, filters=form.filters(), formats=FORMATS)  # type: ignore[arg-type]
            return HttpResponseRedirect(reverse("billing-export-job", args=[job.pk]))
        return export_response(filters=form.filters(), fmt=form.cleaned_data["format"])

    def _page(self, request: HttpRequest, form: ExportPageForm, status: int = 200) -> HttpResponse:
        jobs = ExportJob.objects.select_related("created_by")[:20]
        return render(request, "billing/export.html", {"form": form, "jobs": jobs}, status=status)


class ExportJobPageView(RoleRequiredMixin, View):
    read_roles = LEDGER_READERS

    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        job = get_object_or_404(ExportJob.objects.select_related("created_by"), pk=pk)
        files = [
            {
                "name": name,
                "url": reverse("billing-export-file", args=[job.pk, name]),
                **job.manifest.get("files", {}).get(name, {}),
            }
            for name in export_job_file_names(job)
        ]
        return render(
            request,
            "billing/export_job.html",
            {
                "job": job,
                "files": files,
                "totals": sorted(job.manifest.get("totals", {}).items()),
                "finished": job.status in (ExportJob.Status.SUCCEEDED, ExportJob.Status.FAILED),
            },
        )


class ExportJobFileView(RoleRequiredMixin, View):
    """One file of a finished export job, streamed from the object store."""

    read_roles = LEDGER_READERS

    def get(self, request: HttpRequest, pk: int, name: str) -> StreamingHttpResponse:
        job = get_object_or_404(ExportJob, pk=pk)
        try:
            chunks = export_job_file_chunks(job=job, name=name)
        except LookupError:  # not one of the job's files, or gone from the store
            raise Http404(f"export #{pk} has no file {name}") from None
        fmt = "json" if name == MANIFEST_NAME else job.manifest["files"][name]["format"]
        response = StreamingHttpResponse(chunks, content_type=CONTENT_TYPES[fmt])
        response["Content-Disposition"] = _attachment(f"switchyard-export-{pk}-{name}")
        return response


# --- API ------------------------------------------------------------------------------------------


class _FormatIsAFilter(DefaultContentNegotiation):
    """`?format=csv` chooses the export's format here, not one of DRF's renderers."""

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type


class UsageExportView(APIView):
    """GET /api/usage-export/?format=csv|jsonl|parquet&start=&end=&provider=&cluster=&workflow=&team=&training_run=&unit=

    The ledger rows in FOCUS-style columns, streamed. Ledger readers only.
    """

    read_roles = LEDGER_READERS
    renderer_classes = [JSONRenderer]
    content_negotiation_class = _FormatIsAFilter

    def get(self, request: Request) -> HttpResponseBase:
        params = {key: request.query_params.get(key) for key in request.query_params}
        fmt = params.get("format") or "csv"
        errors: dict[str, list[str]] = {}
        if fmt not in FORMATS:
            errors["format"] = [f"unknown format {fmt!r}; one of {', '.join(FORMATS)}"]
        try:
            filters = export_filters_parse(params=params, ignore=("format",))
        except ExportFilterError as exc:
            errors.update(exc.errors)
        if errors:
            return Response(errors, status=status.HTTP_400_BAD_REQUEST)
        return export_response(filters=filters, fmt=fmt)


class ExportJobSerializer(serializers.ModelSerializer[ExportJob]):
    filters = serializers.DictField(required=False, default=dict)
    formats = serializers.ListField(child=serializers.CharField(), required=False, default=list(FORMATS))
    created_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True
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
            return export_filters_parse(params=value)
        except ExportFilterError as exc:
            raise serializers.ValidationError(exc.errors) from None

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

    def get_files(self, job: ExportJob) -> list[dict[str, str]]:
        return [
            {"name": name, "url": reverse("billing-export-file", args=[job.pk, name])}
            for name in export_job_file_names(job)
        ]

    def get_page(self, job: ExportJob) -> str:
        return reverse("billing-export-job", args=[job.pk])

    def create(self, validated_data: dict[str, Any]) -> ExportJob:
        return export_job_create(
            created_by=self.context["request"].user,
            filters=validated_data.get("filters") or ExportFilters(),
            formats=validated_data["formats"],
        )


class ExportJobViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet[ExportJob]):
    """Export jobs: files plus a signed manifest in the object store (ledger readers)."""

    serializer_class = ExportJobSerializer
    read_roles = write_roles = LEDGER_READERS
    queryset = ExportJob.objects.select_related("created_by")
