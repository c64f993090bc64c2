"""The generation APIs on the chat pipeline, in one table: how each body becomes the request the
router takes, and how the router's answer becomes the API's own document. The /v1 views
(inference.gateway.views) and the Batch API's lines (inference.batch) both use it, so a batch
line is parsed and answered exactly as the same request sent live."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inference.adapters.base import Completion
from inference.gateway.openai_request import (
    ParsedEmbedding,
    ParsedRequest,
    chat_request_parse,
    completion_request_parse,
    embedding_request_parse,
)
from inference.gateway.streaming import StreamTranslator
from inference.gateway.translated.messages_answer import MessagesStream, chat_to_message
from inference.gateway.translated.messages_request import messages_request_parse
from inference.gateway.translated.responses_answer import ResponsesStream, chat_to_response
from inference.gateway.translated.responses_request import responses_request_parse
from inference.router.errors import RouteResult


@dataclass(frozen=True)
class Api:
    """One generation API on the pipeline: how its body becomes the chat or completion request
    the router takes, and (for an API that is not OpenAI's chat or completions) how the chat
    answer becomes its own, plain (`answer(chat_doc, request_id, workflow_slug, body)`) and
    streamed (`stream(request_id, workflow_slug, body)`, a StreamTranslator)."""

    parse: Callable[[dict[str, Any]], ParsedRequest]
    chat: bool = True
    answer: Callable[[dict[str, Any], int | None, str, dict[str, Any]], dict[str, Any]] | None = None
    stream: Callable[[int | None, str, dict[str, Any]], StreamTranslator] | None = None


APIS = {
    "chat": Api(chat_request_parse),
    "completion": Api(completion_request_parse, chat=False),
    "messages": Api(
        messages_request_parse,
        answer=lambda doc, rid, model, body: chat_to_message(doc, request_id=rid, model=model),
        stream=lambda rid, model, body: MessagesStream(rid, model),
    ),
    "responses": Api(
        responses_request_parse,
        answer=lambda doc, rid, model, body: chat_to_response(doc, request_id=rid, model=model, request=body),
        stream=lambda rid, model, body: ResponsesStream(rid, model, body),
    ),
}
RESPONSES = "responses"  # OpenAI's Responses: its responses may be stored (inference.gateway.stored)
EMBEDDINGS = "embeddings"  # not a generation API: its own view, its own answer (the vectors)

# The Batch API's `endpoint` (and each line's `url`) -> the API its lines call.
BATCH_URLS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/responses": "responses",
    "/v1/embeddings": EMBEDDINGS,
}


def api_parse(api: str, body: dict[str, Any]) -> ParsedRequest | ParsedEmbedding:
    """`body` (already through json_document) checked as the live endpoint of `api` checks it."""
    if api == EMBEDDINGS:
        return embedding_request_parse(body)
    return APIS[api].parse(body)


def _synthesized(result: RouteResult, c: Completion, model: str, *, chat: bool) -> dict[str, Any]:
    """An OpenAI answer document for adapters that do not speak OpenAI (Bedrock, replays)."""
    usage = {
        "prompt_tokens": c.tokens_in,
        "completion_tokens": c.tokens_out,
        "total_tokens": c.tokens_in + c.tokens_out,
    }
    if chat:
        return {
            "id": f"chatcmpl-sy{result.request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": c.text},
                    "finish_reason": c.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": usage,
        }
    return {
        "id": f"cmpl-sy{result.request_id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": c.text, "finish_reason": c.finish_reason, "logprobs": None}],
        "usage": usage,
    }


def answer_document(api: str, result: RouteResult, model: str, body: dict[str, Any]) -> dict[str, Any]:
    """The answer of `api` to a routed request that succeeded (`result.completion` is set):
    `model` is the workflow's slug, `body` the request as the caller sent it."""
    c = result.completion
    assert c is not None  # noqa: S101 (only answered requests have a document)
    if api == EMBEDDINGS:
        return {**(c.raw or {}), "model": model}
    spec = APIS[api]
    if c.raw is not None:
        # The provider's answer with every field it sent (tool calls, refusal, logprobs,
        # system_fingerprint, usage details, n choices); only the id and the model are ours.
        doc: dict[str, Any] = {
            **c.raw,
            "id": f"{'chatcmpl' if spec.chat else 'cmpl'}-sy{result.request_id}",
            "model": model,
        }
    else:
        doc = _synthesized(result, c, model, chat=spec.chat)
    if spec.answer is not None:
        doc = spec.answer(doc, result.request_id, model, body)
    return doc
