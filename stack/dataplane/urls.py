"""The /v1 data plane's routes alone (stack.dataplane resolves its requests here)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, include, path

urlpatterns: list[URLPattern | URLResolver] = [path("v1/", include("inference.gateway.urls"))]
