"""The price list page (/billing/prices/) and the API's price import action."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.core.files.uploadedfile import UploadedFile
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views import View
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from billing.price_import import (
    FileImportError,
    RowError,
    decode_upload,
    price_book_listing,
    price_import_file,
    price_import_format_for,
)
from stack.registry.roles import ADMINS, Role, user_has_role
from stack.registry.views import RoleRequiredMixin

MAX_UPLOAD_BYTES = 20 * 1024 * 1024
PRICE_READERS = frozenset({Role.AUDITOR, Role.OPERATOR, Role.ADMIN})
FORMAT_CHOICES = [("", "from the file name (.json is a catalog file)"), ("csv", "CSV"), ("json", "JSON")]


def read_upload(upload: UploadedFile) -> str:
    """An uploaded file's text; FileImportError when too big or not UTF-8."""
    if upload.size is not None and upload.size > MAX_UPLOAD_BYTES:
        raise FileImportError([RowError(1, "", f"file larger than {MAX_UPLOAD_BYTES // 2**20} MiB")])
    return decode_upload(upload.read())


def price_import_upload(*, upload: UploadedFile, file_format: str | None) -> Any:
    return price_import_file(
        text=read_upload(upload), file_format=price_import_format_for(upload.name or "", file_format)
    )


class PriceImportForm(forms.Form):
    file = forms.FileField()
    format = forms.ChoiceField(choices=FORMAT_CHOICES, required=False)


class PriceListView(RoleRequiredMixin, View):
    read_roles = PRICE_READERS
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
                "can_write": user_has_role(request.user, self.write_roles),
            },
            status=status,
        )


class PriceImportRequestSerializer(serializers.Serializer[Any]):
    file = serializers.FileField()
    format = serializers.ChoiceField(choices=["csv", "json"], required=False)


class PriceImportActionMixin:
    """POST /api/price-books/import/ (admins): multipart `file` (+ `format`); all rows or none."""

    @extend_schema(request={"multipart/form-data": PriceImportRequestSerializer})
    @action(detail=False, methods=["post"], url_path="import")
    def import_file(self, request: Request) -> Response:
        payload = PriceImportRequestSerializer(data=request.data)
        payload.is_valid(raise_exception=True)
        try:
            result = price_import_upload(
                upload=payload.validated_data["file"], file_format=payload.validated_data.get("format")
            )
        except FileImportError as exc:
            return Response({"errors": [e.as_dict() for e in exc.errors]}, status=status.HTTP_400_BAD_REQUEST)
        serializer = self.get_serializer(result.created, many=True)  # type: ignore[attr-defined]
        return Response(
            {"created": serializer.data, "unchanged": result.unchanged}, status=status.HTTP_201_CREATED
        )
