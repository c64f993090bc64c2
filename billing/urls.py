"""URLs of the billing pages (mounted at /billing/)."""

from __future__ import annotations

from django.urls import URLPattern, path

from billing.views import alerts, budgets, dashboard, exports, prices, reconciliation

urlpatterns: list[URLPattern] = [
    path("", dashboard.BillingDashboardView.as_view(), name="billing-dashboard"),
    path("ledger/", dashboard.LedgerRowsView.as_view(), name="billing-ledger"),
    path("budgets/", budgets.BudgetListView.as_view(), name="billing-budgets"),
    path("budgets/new/", budgets.BudgetFormView.as_view(), name="billing-budget-new"),
    path("budgets/<int:pk>/edit/", budgets.BudgetFormView.as_view(), name="billing-budget-edit"),
    path(
        "budgets/alerts/<int:pk>/acknowledge/",
        budgets.BudgetAlertAcknowledgeView.as_view(),
        name="billing-budget-alert-ack",
    ),
    path("alert-channels/", alerts.AlertChannelListView.as_view(), name="billing-alert-channels"),
    path("alert-channels/new/", alerts.AlertChannelFormView.as_view(), name="billing-alert-channel-new"),
    path(
        "alert-channels/<int:pk>/edit/",
        alerts.AlertChannelFormView.as_view(),
        name="billing-alert-channel-edit",
    ),
    path("anomalies/", alerts.SpendAnomalyListView.as_view(), name="billing-anomalies"),
    path("anomalies/<int:pk>/", alerts.SpendAnomalyDetailView.as_view(), name="billing-anomaly"),
    path("prices/", prices.PriceListView.as_view(), name="billing-prices"),
    path(
        "reconciliation/",
        reconciliation.ReconciliationListView.as_view(),
        name="billing-reconciliation",
    ),
    path(
        "reconciliation/<int:pk>/",
        reconciliation.ReconciliationDetailView.as_view(),
        name="billing-reconciliation-detail",
    ),
    path("export/", exports.ExportPageView.as_view(), name="billing-export"),
    path("exports/<int:pk>/", exports.ExportJobPageView.as_view(), name="billing-export-job"),
    path(
        "exports/<int:pk>/files/<str:name>",
        exports.ExportJobFileView.as_view(),
        name="billing-export-file",
    ),
]
