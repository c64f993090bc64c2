"""Pages of the cost-quality decisions (build or buy, replays, recommendations)."""

from __future__ import annotations

from django.urls import URLPattern, path

from stack.decisions import recommendation_views

app_name = "decisions"
urlpatterns: list[URLPattern] = [
    path("recommendations/", recommendation_views.RecommendationListView.as_view(), name="recommendations"),
    path(
        "recommendations/<int:pk>/",
        recommendation_views.RecommendationDetailView.as_view(),
        name="recommendation",
    ),
]
