"""Reconciliation pages (/billing/reconciliation/): upload an invoice, see where it differs from the ledger.

Auditors, operators and admins (the ledger readers) read and upload: an invoice
import is evidence to compare with the ledger, it changes neither the ledger nor
the prices, and checking invoices is an auditor's job. Viewers see neither.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views import View

from billing.forms import InvoiceUploadForm
from billing.price_import import FileImportError, RowError, read_upload
from billing.reconciliation import (
    invoice_imports,
    reconciliation_cell_params,
    reconciliation_cell_rows,
    reconciliation_import,
    reconciliation_result,
)
from registry.auth.roles import LEDGER_READERS
from registry.views import RoleRequiredMixin


class ReconciliationListView(RoleRequiredMixin, View):
    platform_only = True  # a provider's invoice covers every team
    read_roles = LEDGER_READERS
    write_roles = LEDGER_READERS

    def get(self, request: HttpRequest) -> HttpResponse:
        return self._page(request, InvoiceUploadForm())

    def post(self, request: HttpRequest) -> HttpResponse:
        form = InvoiceUploadForm(request.POST, request.FILES)
        if not form.is_valid():
            return self._page(request, form, status=400)
        upload = form.cleaned_data["file"]
        try:
            invoice = reconciliation_import(
                provider=form.cleaned_data["provider"],
                filename=upload.name or "invoice.csv",
                text=read_upload(upload),
                tolerance=form.cleaned_data["tolerance"],
                uploaded_by=request.user,  # type: ignore[arg-type]
            )
        except FileImportError as exc:
            return self._page(request, form, errors=exc.errors, status=400)
        return HttpResponseRedirect(reverse("billing-reconciliation-detail", args=[invoice.pk]))

    def _page(
        self,
        request: HttpRequest,
        form: InvoiceUploadForm,
        errors: list[RowError] | None = None,
        status: int = 200,
    ) -> HttpResponse:
        return render(
            request,
            "billing/reconciliation_list.html",
            {"form": form, "errors": errors or [], "invoices": invoice_imports()[:200]},
            status=status,
        )


class ReconciliationDetailView(RoleRequiredMixin, View):
    platform_only = True
    read_roles = LEDGER_READERS

    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        invoice = get_object_or_404(invoice_imports(), pk=pk)
        result = reconciliation_result(invoice=invoice)
        context: dict[str, Any] = {"invoice": invoice, "result": result}
        cell = reconciliation_cell_params(request.GET)
        if cell is not None:
            day, resource, service = cell
            context.update(
                cell_day=day,
                cell_resource=resource,
                cell_service=service,
                rows=reconciliation_cell_rows(
                    invoice=invoice, day=day, resource_id=resource, service=service
                ),
            )
        return render(request, "billing/reconciliation_detail.html", context)
