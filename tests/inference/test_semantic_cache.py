"""Semantic matching in the response cache (inference.cache.semantic), driven by the official SDK
against the gateway: a prompt that means what a cached one meant (by the embeddings deployment's
vectors) is answered from the cache; each embedding is a billed request of its own; what is
compared and what never is; the registry's rules; turning it off forgets the embeddings.

The loopback provider embeds a text as counts of its words hashed into 64 dimensions: two
prompts with the same words in another case or order are similar at 1.0, two prompts sharing a
few words less so, which is all the cache needs to be tested against."""

from __future__ import annotations

import re
import zlib
from decimal import Decimal
from typing import Any

import openai
import pytest
from django.contrib.auth.models import User

from billing.models import UsageRecord
from inference import cache
from inference.cache import semantic
from inference.gateway.caller import gateway_caches_clear
from inference.models import Endpoint, InferenceRequest
from registry.services import api_token_create, workflow_update
from tests.factories import api_client
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.inference.recording_provider import RecordingProvider, chat_answer

pytestmark = pytest.mark.django_db(transaction=True)
USAGE = {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}
COST = (Decimal(1000) * Decimal("1") + Decimal(200) * Decimal("3")) / Decimal(1_000_000)
QUESTION = "What is the capital city of France?"


def words_vector(text: str) -> list[float]:
    vector = [0.0] * 64
    for word in re.findall(r"[a-z]+", text.lower()):
        vector[zlib.crc32(word.encode()) % 64] += 1.0
    return vector


@pytest.fixture(autouse=True)
def _empty_cache() -> Any:
    cache.cache_clear()
    yield
    cache.cache_clear()


@pytest.fixture
def setup(live_server: Any, operator: User, provider: RecordingProvider) -> dict[str, Any]:
    provider.script.answer = chat_answer("Paris.", usage=USAGE)
    provider.script.embed = words_vector
    chat = priced_deployment(base_url=provider.base_url, provider_model_id="chat-model")
    embedder = priced_deployment(
        base_url=provider.base_url, provider_model_id="embed-model", supports_embeddings=True
    )
    workflow = routed_workflow(operator, [chat])
    workflow_update(
        workflow,
        response_cache_seconds=600,
        retain_prompts=True,
        prompt_retention_days=7,
        semantic_cache_threshold=Decimal("0.95"),
        semantic_cache_deployment=embedder,
    )
    _, raw = api_token_create(user=operator, name="semantic")
    return {
        "workflow": workflow,
        "embedder": embedder,
        "operator": operator,
        "client": openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0),
    }


def _ask(setup: dict[str, Any], content: Any = QUESTION, **over: Any) -> Any:
    body: dict[str, Any] = {
        "model": setup["workflow"].slug,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        **over,
    }
    return setup["client"].chat.completions.with_raw_response.create(**body)


def _calls(provider: RecordingProvider, path: str) -> int:
    with provider.script.lock:
        return sum(1 for p, _ in provider.script.bodies if p.endswith(path))


def test_a_prompt_that_means_the_same_is_answered_from_the_cache_and_each_embedding_is_billed(
    setup: dict[str, Any], provider: RecordingProvider
) -> None:
    first = _ask(setup)
    again = _ask(setup, "what is the CAPITAL city of france")  # other text, the same words
    assert _calls(provider, "/chat/completions") == 1 and _calls(provider, "/embeddings") == 2
    assert "x-switchyard-cache" not in first.headers
    assert again.headers["x-switchyard-cache"] == "hit"
    assert float(again.headers["x-switchyard-cache-similarity"]) == pytest.approx(1.0, abs=1e-4)
    assert Decimal(again.headers["x-switchyard-cost"]) == 0
    assert Decimal(again.headers["x-switchyard-cost-avoided"]) == COST
    assert again.parse().choices[0].message.content == "Paris."
    # What the embedder was asked: the prompt as "role: text" lines, as a request of its own.
    embedded = [b for p, b in provider.script.bodies if p.endswith("/embeddings")]
    assert embedded[0] == {"input": [f"user: {QUESTION}"], "model": "embed-model"}

    ledger_settled()
    hit = InferenceRequest.objects.get(pk=int(again.parse().id.removeprefix("chatcmpl-sy")))
    assert (hit.cost, hit.cost_avoided) == (0, COST)
    embeddings = InferenceRequest.objects.filter(endpoint=Endpoint.EMBEDDING, workflow=setup["workflow"])
    assert embeddings.count() == 2
    assert {r.deployment_id for r in embeddings} == {setup["embedder"].pk}
    billed = UsageRecord.objects.filter(subject_id__in=[str(r.pk) for r in embeddings])
    # 4 input tokens per embedding at 1 per million: what matching cost, beside what it saved.
    assert sum(r.amount for r in billed) == Decimal(8) / Decimal(1_000_000)


def test_what_is_compared_and_what_never_is(setup: dict[str, Any], provider: RecordingProvider) -> None:
    _ask(setup)
    # Another question shares words, but not enough (below 0.95): bought.
    assert _ask(setup, "What is the capital city of Spain?").headers.get("x-switchyard-cache") is None
    # The same words asked another way (temperature) is another scope: bought.
    assert (
        _ask(setup, "what is the capital city of france", temperature=0.7).headers.get("x-switchyard-cache")
        is None
    )
    asked = _calls(provider, "/embeddings")
    # A prompt with more than text (an image) is matched exactly or not at all: no embedding.
    image = [
        {"type": "text", "text": QUESTION},
        {"type": "image_url", "image_url": {"url": "https://example.com/france.png"}},
    ]
    with pytest.raises(openai.BadRequestError):  # the route cannot take images; no embedding either
        _ask(setup, image)
    assert _calls(provider, "/embeddings") == asked
    assert _calls(provider, "/chat/completions") == 3


def test_the_agents_apis_match_their_own_prompts(setup: dict[str, Any], provider: RecordingProvider) -> None:
    client = setup["client"]
    slug = setup["workflow"].slug
    client.responses.create(model=slug, input=QUESTION, max_output_tokens=50)
    again = client.responses.with_raw_response.create(
        model=slug,
        input=[{"role": "user", "content": "capital city of France: what is the?"}],
        max_output_tokens=50,
    )
    assert again.headers["x-switchyard-cache"] == "hit"
    assert _calls(provider, "/chat/completions") == 1
    # The chat API's cached answer is never the Responses API's: another scope.
    assert _ask(setup).headers.get("x-switchyard-cache") is None


@pytest.mark.parametrize("redis", [True, False], ids=["redis", "process-memory"])
def test_the_bound_the_ttl_and_turning_it_off_forget_embeddings(
    setup: dict[str, Any], provider: RecordingProvider, settings: Any, monkeypatch: Any, redis: bool
) -> None:
    if not redis:
        settings.REDIS_URL = ""
    workflow_update(setup["workflow"], response_cache_entries=2)
    gateway_caches_clear()
    for country in ("France", "Spain", "Italy"):  # the third drops the oldest embedding and answer
        _ask(setup, f"What is the capital city of {country}?")
    assert _ask(setup, "capital city of Italy: what is the").headers.get("x-switchyard-cache") == "hit"
    assert _ask(setup, "capital city of France: what is the").headers.get("x-switchyard-cache") is None
    # Ten minutes later (the cache's time) nothing is matched, and the lookup drops what expired:
    # the index then holds only the prompt bought then.
    now = semantic.time.time()
    monkeypatch.setattr(semantic.time, "time", lambda: now + 601)
    assert _ask(setup, "what is THE capital city of italy").headers.get("x-switchyard-cache") is None
    monkeypatch.undo()
    held = semantic._store()
    indexes = (
        [k.decode() for k in held.redis.scan_iter(f"{semantic.PREFIX}sem:{setup['workflow'].pk}:*")]
        if isinstance(held, semantic._RedisIndexes)
        else [i for i in held._indexes if i.startswith(f"{semantic.PREFIX}sem:{setup['workflow'].pk}:")]
    )
    assert [len(held.entries(i)) for i in indexes] == [1]
    # Turned off: the embeddings are forgotten, so turning it on again starts empty.
    index_prefix = f"{semantic.PREFIX}sem:{setup['workflow'].pk}:"

    def indexes() -> list[Any]:
        store = semantic._store()
        if isinstance(store, semantic._RedisIndexes):
            return list(store.redis.scan_iter(f"{index_prefix}*"))
        return [i for i in store._indexes if i.startswith(index_prefix)]

    assert indexes()
    workflow_update(setup["workflow"], semantic_cache_threshold=None)
    assert indexes() == []


def test_a_failing_embedder_is_a_miss_never_the_callers_error(
    setup: dict[str, Any], provider: RecordingProvider
) -> None:
    _ask(setup)
    provider.script.embed = lambda text: ["not a number"]  # type: ignore[list-item]
    answer = _ask(setup, "what is the capital city of france")
    assert answer.status_code == 200 and answer.headers.get("x-switchyard-cache") is None
    assert _calls(provider, "/chat/completions") == 2


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"semantic_cache_threshold": "0.3"}, "semantic_cache_threshold"),
        ({"semantic_cache_threshold": "1.5"}, "semantic_cache_threshold"),
        ({"retain_prompts": False, "prompt_retention_days": None}, "semantic_cache_threshold"),
        ({"response_cache_seconds": 0}, "semantic_cache_threshold"),
        ({"semantic_cache_deployment": None}, "semantic_cache_deployment"),
        ({"semantic_cache_deployment": "no-such-deployment"}, "semantic_cache_deployment"),
    ],
)
def test_bad_semantic_settings_are_refused_naming_the_field(
    setup: dict[str, Any], admin_user: User, change: dict[str, Any], field: str
) -> None:
    response = api_client(admin_user).patch(
        f"/api/workflows/{setup['workflow'].slug}/", change, format="json"
    )
    assert response.status_code == 400 and field in response.json(), response.json()
    setup["workflow"].refresh_from_db()
    assert setup["workflow"].semantic_cache_threshold == Decimal("0.95")
    assert setup["workflow"].retain_prompts


def test_a_chat_deployment_is_refused_as_the_embedder(setup: dict[str, Any], admin_user: User) -> None:
    chat = setup["workflow"].policy_versions.first().entries.first().deployment
    response = api_client(admin_user).patch(
        f"/api/workflows/{setup['workflow'].slug}/", {"semantic_cache_deployment": chat.slug}, format="json"
    )
    assert response.status_code == 400
    assert "not an enabled embeddings deployment" in str(response.json()["semantic_cache_deployment"])


def test_the_workflow_page_sets_it_and_says_why_it_cannot(setup: dict[str, Any]) -> None:
    from django.test import Client

    workflow = setup["workflow"]
    page = Client()
    page.force_login(setup["operator"])
    url = f"/workflows/{workflow.slug}/"
    shown = page.get(url).content.decode()
    assert "0.9500</strong> cosine-similar" in shown and setup["embedder"].slug in shown
    form = {
        "action": "retention",
        "prompt_retention_days": "7",
        "response_cache_seconds": "600",
        "response_cache_entries": "100",
        "semantic_cache_threshold": "0.9",
        "semantic_cache_deployment": setup["embedder"].slug,
    }
    # Prompts not kept (the box unticked): refused, the field's error on the page, nothing changed.
    refused = page.post(url, form)
    assert refused.status_code == 400
    assert "it needs prompts kept" in refused.content.decode()
    workflow.refresh_from_db()
    assert workflow.retain_prompts and workflow.semantic_cache_threshold == Decimal("0.95")
    assert page.post(url, {**form, "retain_prompts": "on"}).status_code == 302
    workflow.refresh_from_db()
    assert workflow.semantic_cache_threshold == Decimal("0.9")
    # An empty threshold turns matching off; the exact cache stays.
    assert page.post(url, {**form, "retain_prompts": "on", "semantic_cache_threshold": ""}).status_code == 302
    workflow.refresh_from_db()
    assert workflow.semantic_cache_threshold is None and workflow.response_cache_seconds == 600


def test_the_study_measures_false_hits_on_the_eval_sets(
    setup: dict[str, Any], provider: RecordingProvider
) -> None:
    import json
    from io import StringIO

    from django.core.management import CommandError, call_command

    from inference.models import EvalCase, EvalSet

    workflow = setup["workflow"]
    eval_set = EvalSet.objects.create(workflow=workflow, name="capitals")
    for position, (prompt, expected) in enumerate(
        [
            ("What is the capital city of France?", "Paris"),
            ("what is the capital city of france", " paris "),  # a paraphrase, the same answer
            ("What is the capital city of Spain?", "Madrid"),  # near-misses: 7 of 8 words shared
            ("What is the capital city of Italy?", "Rome"),
            ("How many legs does a spider have?", "8"),
            ("Judge this essay.", ""),  # judged, no expected text: left out
        ]
    ):
        EvalCase.objects.create(eval_set=eval_set, position=position, prompt=prompt, expected=expected)
    out = StringIO()
    call_command("cache_study", workflow=workflow.slug, thresholds="0.85,0.95", stdout=out)
    study = json.loads(out.getvalue())
    assert (study["cases"], study["cases_left_out_without_expected"]) == (5, 1)
    by = {row["threshold"]: row for row in study["thresholds"]}
    # 0.95: only the paraphrase pair matches, each with the right answer.
    assert (by[0.95]["hits"], by[0.95]["false_hits"]) == (2, 0)
    # 0.85: Spain and Italy are served France's or each other's answer (cosine 7/8): false hits.
    assert (by[0.85]["hits"], by[0.85]["false_hits"], by[0.85]["false_hit_rate"]) == (4, 2, 0.4)
    assert _calls(provider, "/embeddings") == 5 and Decimal(study["embedding_cost"]) == Decimal(20) / 10**6

    with pytest.raises(CommandError, match="no workflow"):
        call_command("cache_study", workflow="nope")
    with pytest.raises(CommandError, match="--thresholds"):
        call_command("cache_study", workflow=workflow.slug, thresholds="high")


def test_a_disabled_embedder_makes_lookups_miss_and_blocks_no_other_edit(
    setup: dict[str, Any], provider: RecordingProvider, admin_user: User
) -> None:
    _ask(setup)
    embedder = setup["embedder"]
    embedder.enabled = False
    embedder.save()  # as the registry saves it: cached route plans are dropped
    gateway_caches_clear()
    answer = _ask(setup, "what is the capital city of france")
    assert answer.status_code == 200 and answer.headers.get("x-switchyard-cache") is None
    changed = api_client(admin_user).patch(
        f"/api/workflows/{setup['workflow'].slug}/", {"description": "still editable"}, format="json"
    )
    assert changed.status_code == 200, changed.json()
    # Choosing it again is judged: refused by name.
    again = api_client(admin_user).patch(
        f"/api/workflows/{setup['workflow'].slug}/",
        {"semantic_cache_deployment": setup["embedder"].slug},
        format="json",
    )
    assert again.status_code == 400 and "semantic_cache_deployment" in again.json()
