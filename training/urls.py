"""Training pages: runs under /training/ (`urlpatterns`) and probe jobs under /jobs/
(`probe_urlpatterns`, kept at their original address)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from training import views

urlpatterns: list[URLPattern | URLResolver] = [
    path("", views.RunListView.as_view(), name="training-runs"),
    path("new/", views.RunLaunchView.as_view(), name="training-run-new"),
    path("<int:pk>/", views.RunDetailView.as_view(), name="training-run"),
    path("<int:pk>/metrics.json", views.RunMetricsView.as_view(), name="training-run-metrics"),
    path("<int:pk>/cancel/", views.RunCancelView.as_view(), name="training-run-cancel"),
]

probe_urlpatterns: list[URLPattern | URLResolver] = [
    path("", views.JobListView.as_view(), name="jobs"),
    path("<int:pk>/", views.JobDetailView.as_view(), name="job-detail"),
]
