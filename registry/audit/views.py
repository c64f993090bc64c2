"""The auditors' page: the trail with filters, and its CSV download."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.views import View

from registry.audit.export import audit_csv_rows
from registry.audit.forms import AuditFilterForm
from registry.audit.roles import AUDIT_READERS
from registry.audit.selectors import audit_entries, audit_entries_from_form, object_type_of
from registry.views import RoleRequiredMixin

PAGE_ROWS = 100


class AuditTrailView(RoleRequiredMixin, View):
    """Recorded changes, newest first, 100 a page."""

    read_roles = AUDIT_READERS
    platform_only = True  # the trail records every team's changes

    def get(self, request: HttpRequest) -> HttpResponse:
        form = AuditFilterForm(request.GET or None)
        rows = audit_entries()
        status = 200
        if form.is_bound and not form.is_valid():
            rows, status = rows.none(), 400
        elif form.is_bound:
            rows = audit_entries_from_form(form.cleaned_data)
        page_number = _page(request)
        page = list(rows[page_number * PAGE_ROWS : (page_number + 1) * PAGE_ROWS + 1])
        older = ""
        if len(page) > PAGE_ROWS:
            page = page[:PAGE_ROWS]
            params = request.GET.copy()
            params["page"] = str(page_number + 1)
            older = "?" + params.urlencode()
        for entry in page:
            entry.object_type = object_type_of(entry)  # type: ignore[attr-defined]
        export = "export.csv" + ("?" + request.GET.urlencode() if request.GET else "")
        return render(
            request,
            "audit/trail.html",
            {"form": form, "rows": page, "older": older, "export": export},
            status=status,
        )


class AuditExportView(RoleRequiredMixin, View):
    """The filtered trail as a CSV download, streamed."""

    read_roles = AUDIT_READERS
    platform_only = True  # the trail records every team's changes

    def get(self, request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
        form = AuditFilterForm(request.GET)
        if not form.is_valid():
            return HttpResponse(form.errors.as_text(), status=400, content_type="text/plain; charset=utf-8")
        response = StreamingHttpResponse(
            audit_csv_rows(audit_entries_from_form(form.cleaned_data)), content_type="text/csv; charset=utf-8"
        )
        response["Content-Disposition"] = 'attachment; filename="audit-trail.csv"'
        return response


def _page(request: HttpRequest) -> int:
    value = request.GET.get("page", "0")
    return int(value) if value.isascii() and value.isdigit() and len(value) < 7 else 0
