"""Pages of the cost-quality decisions (build or buy, replays, recommendations)."""

from __future__ import annotations

from django.urls import URLPattern, path

from stack.decisions import views

# No app namespace: URL names are unique project-wide, as stack/access.py and the role matrix
# test key them (reverse("replay-studies")).
urlpatterns: list[URLPattern] = [
    path("replays/", views.ReplayStudyListView.as_view(), name="replay-studies"),
    path("replays/<int:study_id>/", views.ReplayStudyDetailView.as_view(), name="replay-study-page"),
]
