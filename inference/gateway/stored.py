"""Stored `/v1/responses`: `store`, `previous_response_id`, and GET/DELETE /v1/responses/{id}
with its `input_items`.

A response is kept (inference.retention.stored_response_keep) only for a workflow that keeps
prompts (Workflow.retain_prompts, until its prompt_retention_days), only when the caller did not
send `store: false`, and only when it was not streamed; its answer says `store: true` when it was
kept, `false` otherwise. Who may read, continue or delete one is `caller_rows`, the rule every
/v1 object goes through: a caller sees the responses of the workflows its key may reach.

`previous_response_id` continues a kept response of the same workflow: the conversation routed
is that response's input items, its output items, then this request's input (the previous
`instructions` are not carried over, as in OpenAI's API). On a workflow that keeps no prompts it
is a 400 that says so; an id that is unknown, expired, deleted or out of the key's reach is a 404.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from inference.gateway.caller import caller_grant, caller_rows
from inference.gateway.files import json_response, list_document, list_params, object_pk
from inference.gateway.responses import GatewayError, error_response, method_not_allowed
from inference.gateway.translated.common import invalid
from inference.models import StoredResponse
from inference.retention import stored_response_keep
from registry.auth.access import TokenGrant
from registry.models import Workflow

PREFIX = "resp_sy"
_ITEM_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


@dataclass
class Turn:
    """A /v1/responses request as the store sees it: `document` is what is routed (the caller's
    body, with the conversation so far in `input` when it continues one)."""

    document: dict[str, Any]
    continued: bool = False


def responses_own(document: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The caller's body without `previous_response_id` (checked on its own, so that errors
    name the caller's own input items) and that id (None when not sent)."""
    previous = document.get("previous_response_id")
    if previous is None:
        return document, None
    if not isinstance(previous, str):
        raise invalid("previous_response_id", "must be the id of a stored response (resp_sy...)")
    return {k: v for k, v in document.items() if k != "previous_response_id"}, previous


def responses_turn(own: dict[str, Any], previous: str | None, caller: TokenGrant, workflow: Workflow) -> Turn:
    """The conversation a request continues (see the module docstring); `own` has been parsed."""
    if previous is None:
        return Turn(own)
    if not workflow.retain_prompts:
        raise invalid(
            "previous_response_id",
            f"cannot be used: workflow {workflow.slug!r} keeps no responses (it does not retain prompts); "
            "send the whole conversation in input, or have an admin turn on prompt retention",
        )
    found = _visible(caller).filter(pk=object_pk(previous, PREFIX) or 0, workflow=workflow).first()
    if found is None:
        raise GatewayError(
            404,
            f"Previous response {previous[:80]!r} not found: it was never stored, has expired or was "
            "deleted, or it belongs to another workflow",
            type_="invalid_request_error",
            code="previous_response_not_found",
        )
    conversation = [*found.input_items, *found.response.get("output", []), *_items(own["input"])]
    # Each stored response holds its whole conversation: bounded as a request body is, or a
    # long chain would build (and store) documents no caller could have sent.
    if len(json.dumps(conversation, separators=(",", ":"))) > settings.V1_MAX_BODY_BYTES:
        raise invalid(
            "previous_response_id",
            f"continues a conversation longer than a request may be ({settings.V1_MAX_BODY_BYTES} bytes "
            "with this input); start a new one with the part that matters in input",
        )
    return Turn({**own, "input": conversation}, continued=True)


def responses_keep(
    turn: Turn, *, request_id: int | None, workflow: Workflow, answer: dict[str, Any], replayed: bool = False
) -> None:
    """Keep an answered, unstreamed response when the caller and the workflow allow it, and say in
    the answer (`store`) whether it was kept. An idempotent replay (`replayed`) keeps nothing
    again: a response deleted since stays deleted."""
    if replayed:
        answer["store"] = StoredResponse.objects.filter(pk=request_id).exists()
        return
    kept = False
    if turn.document.get("store") is not False and request_id is not None and workflow.retain_prompts:
        kept = stored_response_keep(
            request_id=request_id,
            workflow_id=workflow.pk,
            # The conversation as items, built only when it is kept (not on every request).
            input_items=[
                _with_id(item, request_id, i) for i, item in enumerate(_items(turn.document["input"]))
            ],
            response={**answer, "store": True},
        )
    answer["store"] = kept


def _items(value: Any) -> list[dict[str, Any]]:
    """`input` (already checked by the parser) as Responses input items, message content as parts."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    items = []
    for item in value:
        item = {"type": "message", **item}
        if item["type"] == "message" and isinstance(item.get("content"), str):
            kind = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": kind, "text": item["content"]}]
        items.append(item)
    return items


def _with_id(item: dict[str, Any], request_id: int, index: int) -> dict[str, Any]:
    if "id" in item:
        return item
    prefix = _ITEM_PREFIX.get(str(item.get("type")), "item")
    return {"id": f"{prefix}_sy{request_id}_in{index}", **item, "status": item.get("status", "completed")}


def _visible(caller: TokenGrant) -> QuerySet[StoredResponse]:
    live = StoredResponse.objects.filter(expires_at__gt=timezone.now())
    return caller_rows(live, caller, team="workflow__team", workflow="workflow")


def response_item_answer(request: HttpRequest, response_id: str, rest: str) -> HttpResponse:
    """GET or DELETE /v1/responses/{id}, GET .../input_items, POST .../cancel."""
    try:
        caller = caller_grant(request)
        pk = object_pk(response_id, PREFIX)
        found = _visible(caller).filter(pk=pk).first() if pk is not None else None
        if found is None:
            raise GatewayError(
                404,
                f"No response {response_id[:80]!r}: Switchyard keeps a response only for a workflow "
                "that retains prompts, until its retention ends, and only for keys that may reach it",
                type_="invalid_request_error",
                code="response_not_found",
            )
        return _answer(request, found, rest)
    except GatewayError as exc:
        return error_response(exc.status, str(exc), exc.type, exc.code)


def _answer(request: HttpRequest, found: StoredResponse, rest: str) -> HttpResponse:
    ident = f"{PREFIX}{found.pk}"
    if rest == "/cancel":
        if request.method != "POST":
            return method_not_allowed("POST")
        raise GatewayError(
            400,
            "Only background responses can be cancelled; Switchyard answers every response at once",
            type_="invalid_request_error",
            code="response_not_cancellable",
        )
    if rest == "/input_items":
        if request.method != "GET":
            return method_not_allowed("GET")
        limit, order, after = list_params(request, default_limit=20)
        items = found.input_items if order == "asc" else found.input_items[::-1]
        if after is not None:
            at = next((i for i, item in enumerate(items) if item.get("id") == after), None)
            if at is None:
                raise GatewayError(
                    400,
                    "after must be an item id of this list",
                    type_="invalid_request_error",
                    code="invalid_after",
                )
            items = items[at + 1 :]
        return json_response(list_document(items[:limit], len(items) > limit))
    if request.method == "GET":
        return json_response(found.response)
    if request.method == "DELETE":
        found.delete()
        return json_response({"id": ident, "object": "response", "deleted": True})
    return method_not_allowed("GET, DELETE")
