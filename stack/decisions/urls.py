"""Pages of the cost-quality decisions (build or buy, replays, recommendations)."""

from __future__ import annotations

from django.urls import URLPattern, path

from stack.decisions import views

app_name = "decisions"
urlpatterns: list[URLPattern] = [
    path("replays/", views.ReplayStudyListView.as_view(), name="replay-list"),
    path("replays/<int:study_id>/", views.ReplayStudyDetailView.as_view(), name="replay-detail"),
]
