"""URLs of the billing pages (mounted at /billing/)."""

from __future__ import annotations

from django.urls import URLPattern, path

from billing import budget_views, dashboard_views, export_views, price_views, reconciliation_views

urlpatterns: list[URLPattern] = [
    path("", dashboard_views.BillingDashboardView.as_view(), name="billing-dashboard"),
    path("ledger/", dashboard_views.LedgerRowsView.as_view(), name="billing-ledger"),
    path("budgets/", budget_views.BudgetListView.as_view(), name="billing-budgets"),
    path("budgets/new/", budget_views.BudgetFormView.as_view(), name="billing-budget-new"),
    path("budgets/<int:pk>/edit/", budget_views.BudgetFormView.as_view(), name="billing-budget-edit"),
    path(
        "budgets/alerts/<int:pk>/acknowledge/",
        budget_views.BudgetAlertAcknowledgeView.as_view(),
        name="billing-budget-alert-ack",
    ),
    path("prices/", price_views.PriceListView.as_view(), name="billing-prices"),
    path(
        "reconciliation/",
        reconciliation_views.ReconciliationListView.as_view(),
        name="billing-reconciliation",
    ),
    path(
        "reconciliation/<int:pk>/",
        reconciliation_views.ReconciliationDetailView.as_view(),
        name="billing-reconciliation-detail",
    ),
    path("export/", export_views.ExportPageView.as_view(), name="billing-export"),
    path("exports/<int:pk>/", export_views.ExportJobPageView.as_view(), name="billing-export-job"),
    path(
        "exports/<int:pk>/files/<str:name>",
        export_views.ExportJobFileView.as_view(),
        name="billing-export-file",
    ),
]
