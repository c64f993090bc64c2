"""Stored /v1/responses (inference.gateway.stored), driven by the official `openai` SDK: `store`,
`previous_response_id`, retrieve, delete and input_items; kept only under the workflow's prompt
retention, within the key's reach, and gone on opt-out or expiry."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import openai
import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from inference.models import InferenceRequest, StoredResponse
from inference.retention import retained_prompts_purge
from registry.models import Workflow
from registry.services import api_token_create
from tests.factories import make_team
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.inference.recording_provider import RecordingProvider, chat_answer

pytestmark = pytest.mark.django_db(transaction=True)


def _client(live_server: Any, raw: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0)


def _workflow(owner: User, provider: RecordingProvider, **policy: Any) -> Workflow:
    deployment = priced_deployment(base_url=provider.base_url, provider_model_id="provider-model")
    return routed_workflow(owner, [deployment], **policy)


@pytest.fixture
def kept(live_server: Any, operator: User, provider: RecordingProvider) -> tuple[openai.OpenAI, Workflow]:
    """A workflow that retains prompts for 7 days, and a key of its owner."""
    workflow = _workflow(operator, provider, retain_prompts=True, prompt_retention_days=7)
    _, raw = api_token_create(user=operator, name="responses")
    return _client(live_server, raw), workflow


def _texts(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(m["role"], m.get("content")) for m in messages]


def test_a_kept_response_is_continued_read_listed_and_deleted(
    kept: tuple[openai.OpenAI, Workflow], provider: RecordingProvider
) -> None:
    client, workflow = kept
    provider.script.answer = chat_answer("Paris.")
    first = client.responses.create(
        model=workflow.slug, instructions="Be brief.", input="What is the capital of France?"
    )
    assert first.store is True and first.previous_response_id is None

    provider.script.answer = chat_answer("Rome.")
    second = client.responses.create(
        model=workflow.slug, previous_response_id=first.id, input="And of Italy?"
    )
    # The conversation so far, then the new turn; the first turn's instructions are not carried.
    assert _texts(provider.script.last_body["messages"]) == [
        ("user", "What is the capital of France?"),
        ("assistant", "Paris."),
        ("user", "And of Italy?"),
    ]
    assert second.store is True and second.previous_response_id == first.id

    retrieved = client.responses.retrieve(second.id)
    assert (retrieved.id, retrieved.output_text, retrieved.store) == (second.id, "Rome.", True)
    assert retrieved.previous_response_id == first.id

    listed = client.responses.input_items.list(second.id, order="asc")
    roles = [(item.type, item.role) for item in listed.data]  # type: ignore[union-attr]
    assert roles == [("message", "user"), ("message", "assistant"), ("message", "user")]
    assert listed.data[0].content[0].text == "What is the capital of France?"  # type: ignore[union-attr]
    newest = client.responses.input_items.list(second.id, limit=1)  # newest first by default
    assert newest.data[0].content[0].text == "And of Italy?"  # type: ignore[union-attr]
    assert newest.has_more is True
    rest = client.responses.input_items.list(second.id, after=newest.data[0].id)
    assert [item.id for item in rest.data] == [item.id for item in reversed(listed.data[:2])]

    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError) as gone:
        client.responses.retrieve(first.id)
    assert gone.value.code == "response_not_found"
    calls, rows = provider.script.calls(), InferenceRequest.objects.count()
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model=workflow.slug, previous_response_id=first.id, input="And of Spain?")
    assert missing.value.code == "previous_response_not_found"
    assert provider.script.calls() == calls and InferenceRequest.objects.count() == rows
    # The second response holds its whole conversation: it goes on without the first.
    assert client.responses.retrieve(second.id).output_text == "Rome."


def test_a_streamed_turn_continues_a_kept_response_and_is_not_kept_itself(
    kept: tuple[openai.OpenAI, Workflow], provider: RecordingProvider
) -> None:
    client, workflow = kept
    provider.script.answer = chat_answer("Paris.")
    first = client.responses.create(model=workflow.slug, input="Capital of France?")
    provider.script.answer = chat_answer("Rome.")
    with client.responses.stream(
        model=workflow.slug, previous_response_id=first.id, input="Italy?"
    ) as events:
        events.until_done()
        streamed = events.get_final_response()
    assert _texts(provider.script.last_body["messages"])[-2:] == [("assistant", "Paris."), ("user", "Italy?")]
    assert streamed.output_text == "Rome." and streamed.store is False
    assert streamed.previous_response_id == first.id
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(streamed.id)


def test_store_false_or_a_workflow_without_retention_keeps_nothing(
    kept: tuple[openai.OpenAI, Workflow], provider: RecordingProvider, operator: User
) -> None:
    client, workflow = kept
    provider.script.answer = chat_answer("Paris.")
    unkept = client.responses.create(model=workflow.slug, input="Capital of France?", store=False)
    assert unkept.store is False and not StoredResponse.objects.exists()
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)

    plain = _workflow(operator, provider)  # keeps no prompts
    answered = client.responses.create(model=plain.slug, input="Capital of France?")
    assert answered.store is False and not StoredResponse.objects.exists()
    calls = provider.script.calls()
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=plain.slug, previous_response_id=answered.id, input="And Italy?")
    assert refused.value.param == "previous_response_id" and "retain" in refused.value.message
    with pytest.raises(openai.BadRequestError) as typed:
        client.responses.create(model=workflow.slug, input="x", extra_body={"previous_response_id": 12})
    assert typed.value.param == "previous_response_id"
    assert provider.script.calls() == calls


def test_a_key_that_may_not_reach_the_workflow_cannot_read_continue_or_delete_its_responses(
    live_server: Any, operator: User, provider: RecordingProvider
) -> None:
    ours, theirs = make_team(), make_team()
    workflow = _workflow(operator, provider, retain_prompts=True, prompt_retention_days=7, team=ours)
    other = _workflow(operator, provider, retain_prompts=True, prompt_retention_days=7, team=theirs)
    _, mine = api_token_create(user=operator, name="ours", team=ours)
    _, outsider = api_token_create(user=operator, name="theirs", team=theirs)
    provider.script.answer = chat_answer("Paris.")
    first = _client(live_server, mine).responses.create(model=workflow.slug, input="Capital of France?")

    stranger = _client(live_server, outsider)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.input_items.list(first.id)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.delete(first.id)
    # Named from another workflow (one the stranger may call), it is not found either.
    with pytest.raises(openai.NotFoundError) as missing:
        stranger.responses.create(model=other.slug, previous_response_id=first.id, input="And Italy?")
    assert missing.value.code == "previous_response_not_found"
    assert StoredResponse.objects.filter(pk=InferenceRequest.objects.get().pk).exists()


def test_opting_out_and_expiry_delete_kept_responses(
    kept: tuple[openai.OpenAI, Workflow], provider: RecordingProvider
) -> None:
    client, workflow = kept
    provider.script.answer = chat_answer("Paris.")
    first = client.responses.create(model=workflow.slug, input="Capital of France?")
    row = StoredResponse.objects.get()
    assert row.expires_at - row.created_at == timedelta(days=7)

    # Past its expiry it is not found at once, and beat's purge deletes it.
    StoredResponse.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    assert retained_prompts_purge()["stored_responses"] == 1

    second = client.responses.create(model=workflow.slug, input="Capital of Italy?")
    assert client.responses.retrieve(second.id).store is True
    workflow.retain_prompts = False
    workflow.save()
    assert not StoredResponse.objects.exists()
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(second.id)


def test_a_conversation_longer_than_a_request_may_be_is_not_continued(
    kept: tuple[openai.OpenAI, Workflow], provider: RecordingProvider, settings: Any
) -> None:
    client, workflow = kept
    provider.script.answer = chat_answer("Paris. " * 40)
    first = client.responses.create(model=workflow.slug, input="Capital of France?")
    settings.V1_MAX_BODY_BYTES = 300  # the new turn's body fits; the conversation it continues does not
    calls = provider.script.calls()
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=workflow.slug, previous_response_id=first.id, input="And Italy?")
    assert refused.value.param == "previous_response_id" and "longer than a request" in refused.value.message
    assert provider.script.calls() == calls and StoredResponse.objects.count() == 1


def test_a_deleted_response_stays_deleted_when_its_request_is_replayed(
    kept: tuple[openai.OpenAI, Workflow], provider: RecordingProvider
) -> None:
    client, workflow = kept
    provider.script.answer = chat_answer("Paris.")
    again = {"Idempotency-Key": "ask-once"}
    first = client.responses.create(model=workflow.slug, input="Capital of France?", extra_headers=again)
    assert first.store is True
    client.responses.delete(first.id)
    replay = client.responses.create(model=workflow.slug, input="Capital of France?", extra_headers=again)
    assert replay.id == first.id and replay.store is False and provider.script.calls() == 1
    assert not StoredResponse.objects.exists()
