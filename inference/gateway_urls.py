"""The OpenAI-compatible gateway, mounted at /v1/."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver

urlpatterns: list[URLPattern | URLResolver] = []
