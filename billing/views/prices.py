"""The price list page (/billing/prices/): every version per target and unit, and a file import."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views import View

from billing.forms import PriceImportForm
from billing.price_import import FileImportError, RowError, price_book_listing, price_import_upload
from registry.auth.roles import ADMINS, LEDGER_READERS
from registry.views import RoleRequiredMixin, shared_writer


class PriceListView(RoleRequiredMixin, View):
    read_roles = LEDGER_READERS
    write_roles = ADMINS

    def get(self, request: HttpRequest) -> HttpResponse:
        return self._page(request, PriceImportForm())

    def post(self, request: HttpRequest) -> HttpResponse:
        form = PriceImportForm(request.POST, request.FILES)
        if not form.is_valid():
            return self._page(request, form, status=400)
        try:
            result = price_import_upload(
                upload=form.cleaned_data["file"], file_format=form.cleaned_data["format"]
            )
        except FileImportError as exc:
            return self._page(request, form, errors=exc.errors, status=400)
        messages.success(
            request,
            f"Imported {len(result.created)} price version(s)"
            + (f"; {result.unchanged} already present." if result.unchanged else "."),
        )
        return HttpResponseRedirect(reverse("billing-prices"))

    def _page(
        self,
        request: HttpRequest,
        form: PriceImportForm,
        errors: list[RowError] | None = None,
        status: int = 200,
    ) -> HttpResponse:
        return render(
            request,
            "billing/prices.html",
            {
                "targets": price_book_listing(),
                "form": form,
                "errors": errors or [],
                "can_write": shared_writer(request.user, self.write_roles),
            },
            status=status,
        )
