from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.routers import DefaultRouter

from billing.api import PriceBookViewSet, UsageRecordViewSet
from billing.budget_views import BudgetAlertViewSet, BudgetViewSet
from billing.export_views import ExportJobViewSet, UsageExportView
from billing.reconciliation_views import InvoiceImportViewSet
from stack import views
from stack.api.permissions import RolePermission
from stack.api.views import (
    ClusterViewSet,
    DeploymentViewSet,
    FailoverEventViewSet,
    ProviderViewSet,
    RegisteredModelViewSet,
    WorkflowViewSet,
)
from training.api import ProbeJobViewSet

router = DefaultRouter()
router.register("providers", ProviderViewSet)
router.register("clusters", ClusterViewSet)
router.register("models", RegisteredModelViewSet)
router.register("deployments", DeploymentViewSet)
router.register("workflows", WorkflowViewSet)
router.register("failover-events", FailoverEventViewSet, basename="failoverevent")
router.register("probe-jobs", ProbeJobViewSet)
router.register("usage-records", UsageRecordViewSet, basename="usagerecord")
router.register("price-books", PriceBookViewSet)
router.register("budgets", BudgetViewSet)
router.register("budget-alerts", BudgetAlertViewSet, basename="budgetalert")
router.register("export-jobs", ExportJobViewSet, basename="exportjob")
router.register("invoice-imports", InvoiceImportViewSet, basename="invoiceimport")

urlpatterns = [
    path("", include("stack.web_urls")),
    path("healthz", views.healthz, name="healthz"),
    path("billing/", include("billing.urls")),
    path("admin/", admin.site.urls),
    # drf-spectacular serves the schema to anyone by default; like every other
    # /api/ call it needs a token or a session (401 without).
    path("api/schema/", SpectacularAPIView.as_view(permission_classes=[RolePermission]), name="schema"),
    path("api/usage-export/", UsageExportView.as_view(), name="usage-export"),
    path("api/", include(router.urls)),
]
