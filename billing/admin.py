from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from billing.models import AlertChannel, AlertDelivery, PriceBook, SpendAnomaly, UsageRecord
from billing.selectors import price_book_next_version


@admin.register(PriceBook)
class PriceBookAdmin(admin.ModelAdmin[PriceBook]):
    list_display = ["__str__", "unit", "unit_price", "currency", "effective_from", "version"]
    list_filter = ["unit", "currency"]
    readonly_fields = ["version"]

    def save_model(self, request: HttpRequest, obj: PriceBook, form: Any, change: bool) -> None:
        if not change:
            # Number it like billing.services.price_book_publish does.
            obj.version = price_book_next_version(
                cluster=obj.cluster, deployment=obj.deployment, provider=obj.provider, unit=obj.unit
            )
        super().save_model(request, obj, form, change)

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


@admin.register(AlertChannel)
class AlertChannelAdmin(admin.ModelAdmin[AlertChannel]):
    # URL and secret are encrypted and not editable here: the channel page validates them.
    list_display = ["name", "kind", "url_host", "budget_alerts", "anomaly_alerts", "daily_digest", "active"]
    readonly_fields = ["url_host"]


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(admin.ModelAdmin[AlertDelivery]):
    list_display = ["created_at", "channel", "kind", "dedup_key", "status", "repeats"]
    list_filter = ["kind", "channel"]


@admin.register(SpendAnomaly)
class SpendAnomalyAdmin(admin.ModelAdmin[SpendAnomaly]):
    list_display = ["day", "dimension", "target_label", "rate", "threshold", "currency"]
