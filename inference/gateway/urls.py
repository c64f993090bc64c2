"""The gateway, mounted at /v1/: OpenAI's APIs and Anthropic's Messages (inference.gateway.views),
OpenAI's Files and Batch APIs (inference.gateway.files, inference.gateway.batches)."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path, re_path

from inference.gateway import batches, files
from inference.gateway import views as gateway

_ID = r"(?P<{}>[A-Za-z0-9_-]{{1,128}})"  # any id-like segment: an unknown one is a 404 that names it

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
    path("files", files.files, name="gateway-files"),
    re_path(rf"^files/{_ID.format('file_ref')}$", files.file_item, name="gateway-file"),
    re_path(rf"^files/{_ID.format('file_ref')}/content$", files.file_content, name="gateway-file-content"),
    path("batches", batches.batches, name="gateway-batches"),
    re_path(rf"^batches/{_ID.format('batch_ref')}$", batches.batch_item, name="gateway-batch"),
    re_path(
        rf"^batches/{_ID.format('batch_ref')}/cancel$", batches.batch_cancel, name="gateway-batch-cancel"
    ),
]
