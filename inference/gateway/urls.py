"""The OpenAI-compatible gateway, mounted at /v1/ (inference.gateway.views)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from inference.gateway import views as gateway

urlpatterns: list[URLPattern | URLResolver] = [
    path("chat/completions", gateway.chat_completions, name="gateway-chat"),
    path("completions", gateway.completions, name="gateway-completions"),
    path("embeddings", gateway.embeddings, name="gateway-embeddings"),
    path("models", gateway.models, name="gateway-models"),
]
