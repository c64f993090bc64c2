from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.routers import DefaultRouter

from billing.api import PriceBookViewSet, UsageRecordViewSet
from billing.budget_views import BudgetAlertViewSet, BudgetViewSet
from billing.export_views import ExportJobViewSet, UsageExportView
from billing.reconciliation_views import InvoiceImportViewSet
from inference import api as inference_api
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
from training import api as training_api

router = DefaultRouter()
router.register("providers", ProviderViewSet)
router.register("clusters", ClusterViewSet)
router.register("models", RegisteredModelViewSet)
router.register("deployments", DeploymentViewSet)
router.register("workflows", WorkflowViewSet)
router.register("failover-events", FailoverEventViewSet, basename="failoverevent")
router.register("usage-records", UsageRecordViewSet, basename="usagerecord")
router.register("price-books", PriceBookViewSet)
router.register("budgets", BudgetViewSet)
router.register("budget-alerts", BudgetAlertViewSet, basename="budgetalert")
router.register("export-jobs", ExportJobViewSet, basename="exportjob")
router.register("invoice-imports", InvoiceImportViewSet, basename="invoiceimport")
training_api.register(router)
inference_api.register(router)

urlpatterns = [
    path("", include("stack.web_urls")),
    path("healthz", views.healthz, name="healthz"),
    path("billing/", include("billing.urls")),
    path("training/", include("training.urls")),
    path("inference/", include("inference.urls")),
    # OpenAI-compatible gateway: `model` names a workflow (inference.gateway).
    path("v1/", include("inference.gateway_urls")),
    path("admin/", admin.site.urls),
    # drf-spectacular serves the schema to anyone by default; like every other
    # /api/ call it needs a token or a session (401 without).
    path("api/schema/", SpectacularAPIView.as_view(permission_classes=[RolePermission]), name="schema"),
    path("api/usage-export/", UsageExportView.as_view(), name="usage-export"),
    path("api/", include(router.urls)),
]
