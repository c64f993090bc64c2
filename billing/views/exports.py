"""Export pages: pick filters and download now or run a job (/billing/export/), job pages and their files."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseRedirect,
    JsonResponse,
    StreamingHttpResponse,
)
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views import View
from django.views.decorators.http import require_GET

from billing.downloads import export_job_file_response, export_response
from billing.exports import (
    FORMATS,
    export_job_create,
    export_job_file_names,
    export_jobs_of_teams,
    export_public_keys_json,
)
from billing.forms import ExportPageForm
from billing.models import ExportJob
from registry.auth.roles import LEDGER_READERS
from registry.auth.teams import team_slugs, user_teams_with_role
from registry.views import RoleRequiredMixin


def export_jobs_visible(request: HttpRequest) -> QuerySet[ExportJob]:
    """Export jobs the caller may see: all for a platform role, those whose teams are all the
    caller's for a team-scoped user (billing.exports.export_jobs_of_teams, as the API)."""
    teams = user_teams_with_role(request.user, LEDGER_READERS)  # the role held in each team
    return export_jobs_of_teams(ExportJob.objects.select_related("created_by"), teams)


class ExportPageView(RoleRequiredMixin, View):
    """Pick a period and filters; download now, or run an export job to the object store."""

    read_roles = write_roles = LEDGER_READERS

    def get(self, request: HttpRequest) -> HttpResponse:
        return self._page(request, self._form(request))

    @staticmethod
    def _form(request: HttpRequest, data: Any = None) -> ExportPageForm:
        form = ExportPageForm(data)
        slugs = team_slugs(user_teams_with_role(request.user, LEDGER_READERS))
        if slugs is not None:
            # A team-scoped caller exports one of its teams' rows, never the whole ledger.
            form.fields["team"] = forms.ChoiceField(
                choices=[(slug, slug) for slug in sorted(slugs)],
                error_messages={"invalid_choice": "no team %(value)s that you can see"},
            )
        return form

    def post(self, request: HttpRequest) -> HttpResponseBase:
        form = self._form(request, request.POST)
        if not form.is_valid():
            return self._page(request, form, status=400)
        if request.POST.get("action") == "job":
            job = export_job_create(created_by=request.user, filters=form.filters(), formats=FORMATS)  # type: ignore[arg-type]
            return HttpResponseRedirect(reverse("billing-export-job", args=[job.pk]))
        return export_response(filters=form.filters(), fmt=form.cleaned_data["format"])

    def _page(self, request: HttpRequest, form: ExportPageForm, status: int = 200) -> HttpResponse:
        jobs = export_jobs_visible(request)[:20]
        return render(request, "billing/export.html", {"form": form, "jobs": jobs}, status=status)


class ExportJobPageView(RoleRequiredMixin, View):
    read_roles = LEDGER_READERS

    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        job = get_object_or_404(export_jobs_visible(request), pk=pk)
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
                # Each partition's head when the export started, and its rows in the export.
                "chains": [
                    (partition, head, job.manifest.get("partitions", {}).get(partition, {}))
                    for partition, head in sorted(job.manifest.get("heads", {}).items())
                ],
                "finished": job.status in (ExportJob.Status.SUCCEEDED, ExportJob.Status.FAILED),
            },
        )


class ExportJobFileView(RoleRequiredMixin, View):
    """One file of a finished export job, streamed from the object store."""

    read_roles = LEDGER_READERS

    def get(self, request: HttpRequest, pk: int, name: str) -> StreamingHttpResponse:
        job = get_object_or_404(export_jobs_visible(request), pk=pk)
        try:
            return export_job_file_response(job=job, name=name)
        except LookupError:  # not one of the job's files, or gone from the store
            raise Http404(f"export #{pk} has no file {name}") from None


@require_GET
def export_public_keys_view(request: HttpRequest) -> JsonResponse:
    """GET /.well-known/switchyard-export-keys.json: the Ed25519 public keys (current and retired)
    that check export manifests. Public on purpose, like any public key: an auditor without an
    account fetches them to verify a download."""
    return JsonResponse(export_public_keys_json())
