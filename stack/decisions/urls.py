"""Pages of the cost-quality decisions (build or buy, replays, recommendations)."""

from __future__ import annotations

from django.urls import URLPattern

app_name = "decisions"
urlpatterns: list[URLPattern] = []
