from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from billing.models import PriceBook, UsageRecord


@admin.register(PriceBook)
class PriceBookAdmin(admin.ModelAdmin[PriceBook]):
    list_display = ["__str__", "unit", "unit_price", "currency", "effective_from", "version"]
    list_filter = ["unit", "currency"]

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A price that priced usage is history; supersede it with a new version.
        if obj is not None and obj.usage.exists():
            return False
        return super().has_change_permission(request, obj)


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin[UsageRecord]):
    list_display = [
        "occurred_at",
        "subject_type",
        "subject_id",
        "cluster",
        "quantity",
        "unit",
        "amount",
        "currency",
    ]
    list_filter = ["unit", "subject_type", "currency"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
