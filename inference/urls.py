"""Inference pages, mounted at /inference/."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from inference import views

urlpatterns: list[URLPattern | URLResolver] = [
    path("", views.InferenceHomeView.as_view(), name="inference-home"),
    path("workflows/<slug:slug>/", views.WorkflowInferenceView.as_view(), name="inference-workflow"),
    path("providers/<slug:slug>/", views.ProviderInferenceView.as_view(), name="inference-provider"),
]
