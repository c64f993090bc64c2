from __future__ import annotations

from django.urls import URLPattern, path

from registry.audit import views

urlpatterns: list[URLPattern] = [
    path("", views.AuditTrailView.as_view(), name="audit-trail"),
    path("export.csv", views.AuditExportView.as_view(), name="audit-export"),
]
