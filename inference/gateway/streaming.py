"""A routed answer streamed to the client as server-sent events, in the OpenAI chunk format or
translated by another API's StreamTranslator (Anthropic's Messages events or OpenAI's Responses
events, inference.gateway.translated)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from django.http import HttpResponse, StreamingHttpResponse

from inference.adapters.base import InferenceInput
from inference.gateway.responses import answer_headers, route_failure, tokens_used
from inference.ratelimit.limits import RateCheck
from inference.router.entry import route_stream
from registry.auth.access import TokenGrant
from registry.models import Workflow


class StreamTranslator(Protocol):
    """Chat chunk documents in, another API's stream events out."""

    def start(self) -> Iterator[bytes]: ...

    def feed(self, chunk: dict[str, Any]) -> Iterator[bytes]: ...

    def end(self, switchyard: dict[str, Any] | None, *, broken: bool) -> Iterator[bytes]:
        """The closing events; `broken`: the provider's stream broke, the answer is incomplete."""
        ...


def _sse(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


def stream_response(
    workflow: Workflow,
    payload: InferenceInput,
    endpoint: str,
    caller: TokenGrant,
    *,
    chat: bool,
    include_usage: bool,
    limits: RateCheck,
    translate: Callable[[int | None], StreamTranslator] | None = None,
) -> HttpResponse | StreamingHttpResponse:
    """`translate`: the events of another API, made by a translator given the request's id (its
    chunks always carry the usage, which the translated events report)."""
    routed = route_stream(
        workflow=workflow,
        request=payload,
        endpoint=endpoint,
        api_key_id=caller.token_id,
        retain=workflow.retain_prompts,
        peeked=limits.peeked,
    )
    if not routed.ok:
        assert routed.result is not None  # noqa: S101 (route_stream records a failure at once)
        limits.settle(0)
        return route_failure(routed.result, caller, workflow.team_id)
    created = int(time.time())
    obj = "chat.completion.chunk" if chat else "text_completion"
    # The same shape as a plain answer's id (inference.gateway.views): the request's own id,
    # reserved when the deployment answered and recorded when the stream ends.
    ident = f"{'chatcmpl' if chat else 'cmpl'}-sy{routed.request_id}"

    def event(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "id": ident,
            "object": obj,
            "created": created,
            "model": workflow.slug,
            "choices": choices,
        }
        if usage is not None:
            doc["usage"] = usage
        return doc

    def passed_on(raw: dict[str, Any]) -> dict[str, Any] | None:
        """A provider's event as the client gets it: our id and model; the usage event (which
        the adapter always asks for, to bill) only when the client asked for it."""
        if not include_usage:
            if not raw.get("choices") and raw.get("usage"):
                return None
            raw = {k: v for k, v in raw.items() if k != "usage"}
        return {**raw, "id": ident, "model": workflow.slug}

    if translate is not None:
        include_usage = True

    def docs() -> Iterator[dict[str, Any]]:
        """The events; a provider's own (`chunk.raw`) are passed on, others are made here."""
        started = False
        finish = "stop"
        tokens: tuple[int, int] | None = None
        made = False  # events made here (a provider that does not speak OpenAI's format)
        for chunk in routed:
            if chunk.raw is not None:
                doc = passed_on(chunk.raw)
                if doc is not None:
                    yield doc
                continue
            made = True
            if chat and not started:
                started = True
                yield event(
                    [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
                )
            if chunk.text:
                choice = (
                    {"index": 0, "delta": {"content": chunk.text}, "finish_reason": None}
                    if chat
                    else {"index": 0, "text": chunk.text, "finish_reason": None}
                )
                yield event([choice])
            if chunk.finish_reason:
                finish = chunk.finish_reason
            if chunk.tokens_in is not None:
                tokens = (chunk.tokens_in, chunk.tokens_out or 0)
        if not made:
            return
        last = (
            {"index": 0, "delta": {}, "finish_reason": finish}
            if chat
            else {"index": 0, "text": "", "finish_reason": finish}
        )
        yield event([last])
        if include_usage:
            t_in, t_out = tokens or (0, 0)
            yield event([], {"prompt_tokens": t_in, "completion_tokens": t_out, "total_tokens": t_in + t_out})

    def events() -> Iterator[bytes]:
        # The last event is held back until the stream has ended and been recorded, so that it
        # can carry the request's cost (`switchyard`: request_id, deployment, and cost and
        # currency for a caller whose role may see costs).
        held: dict[str, Any] | None = None
        for doc in docs():
            if held is not None:
                yield _sse(held)
            held = doc
        limits.settle(tokens_used(routed.result))
        if held is not None:
            ours = switchyard()
            if ours is not None:
                held["switchyard"] = ours
            yield _sse(held)
        yield b"data: [DONE]\n\n"

    def switchyard() -> dict[str, Any] | None:
        """The request's id and deployment, and its cost for a caller whose role may see costs."""
        result = routed.result
        if result is None:
            return None
        ours: dict[str, Any] = {"request_id": result.request_id, "deployment": result.deployment_slug}
        if caller.sees_costs(workflow.team_id):  # the rule of the x-switchyard-cost header
            ours |= {"cost": f"{result.cost:f}", "currency": result.currency}
        return ours

    def translated_events(translator: StreamTranslator) -> Iterator[bytes]:
        yield from translator.start()
        for doc in docs():
            yield from translator.feed(doc)
        limits.settle(tokens_used(routed.result))
        yield from translator.end(switchyard(), broken=routed.broken)

    response = StreamingHttpResponse(
        translated_events(translate(routed.request_id)) if translate is not None else events(),
        content_type="text/event-stream",
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    answer_headers(response, None, routed.deployment_slug, caller, workflow.team_id)
    return response
