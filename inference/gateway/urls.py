"""The gateway, mounted at /v1/: OpenAI's APIs and Anthropic's Messages (inference.gateway.views)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path, re_path

from inference.gateway import views as gateway

urlpatterns: list[URLPattern | URLResolver] = [
    path("chat/completions", gateway.chat_completions, name="gateway-chat"),
    path("completions", gateway.completions, name="gateway-completions"),
    path("embeddings", gateway.embeddings, name="gateway-embeddings"),
    path("models", gateway.models, name="gateway-models"),
    path("responses", gateway.responses, name="gateway-responses"),
    re_path(
        r"^responses/(?P<response_id>[A-Za-z0-9_-]{1,128})(?P<rest>/input_items|/cancel)?$",
        gateway.response_item,
    ),
    path("messages", gateway.messages, name="gateway-messages"),
    path("messages/count_tokens", gateway.messages_count_tokens, name="gateway-messages-count-tokens"),
]
