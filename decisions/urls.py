"""Pages of the cost-quality decisions (build or buy, replays, recommendations)."""

from __future__ import annotations

from django.urls import URLPattern, path

from decisions.recommendations import views as recommendation_views
from decisions.replay import views

app_name = "decisions"
urlpatterns: list[URLPattern] = [
    path("recommendations/", recommendation_views.RecommendationListView.as_view(), name="recommendations"),
    path(
        "recommendations/<int:pk>/",
        recommendation_views.RecommendationDetailView.as_view(),
        name="recommendation",
    ),
    path("replays/", views.ReplayStudyListView.as_view(), name="replay-studies"),
    path("replays/<int:study_id>/", views.ReplayStudyDetailView.as_view(), name="replay-study-page"),
]
