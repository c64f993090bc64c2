"""URLs of the billing pages (mounted at /billing/)."""

from __future__ import annotations

from django.urls import URLPattern, path

from billing import export_views

urlpatterns: list[URLPattern] = [
    path("export/", export_views.ExportPageView.as_view(), name="billing-export"),
    path("exports/<int:pk>/", export_views.ExportJobPageView.as_view(), name="billing-export-job"),
    path(
        "exports/<int:pk>/files/<str:name>",
        export_views.ExportJobFileView.as_view(),
        name="billing-export-file",
    ),
]
