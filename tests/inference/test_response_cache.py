"""The response cache (inference.cache), driven by the official SDKs against the gateway: an exact
repeat is answered without calling the provider, recorded at no cost with the cost it avoided
(request row, ledger row, export, dashboard); what is a repeat and what is not; how long and how
many answers are kept; a new route version, another workflow, a stream or an Idempotency-Key
never read it; Redis (shared) and process memory (no REDIS_URL) behave alike."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import anthropic
import openai
import pytest
from django.contrib.auth.models import User
from django.test import Client

from billing.exports import ExportFilters, export_rows
from billing.exports.columns import COLUMNS
from billing.models import UsageRecord
from inference import cache
from inference.cache import exact
from inference.models import InferenceRequest
from inference.ratelimit.limits import rate_limiter_reset
from registry.models import Workflow
from registry.services import api_token_create, workflow_switch_primary, workflow_update
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.inference.recording_provider import RecordingProvider, chat_answer

pytestmark = pytest.mark.django_db(transaction=True)
USAGE = {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}
COST = (Decimal(1000) * Decimal("1") + Decimal(200) * Decimal("3")) / Decimal(1_000_000)


@pytest.fixture(autouse=True)
def _empty_cache() -> Any:
    cache.cache_clear()
    yield
    cache.cache_clear()


@pytest.fixture
def setup(live_server: Any, operator: User, provider: RecordingProvider) -> dict[str, Any]:
    provider.script.answer = chat_answer("cached words", usage=USAGE)
    deployment = priced_deployment(base_url=provider.base_url, provider_model_id="provider-model")
    backup = priced_deployment(base_url=provider.base_url, provider_model_id="provider-model")
    workflow = routed_workflow(operator, [deployment, backup])
    workflow_update(workflow, response_cache_seconds=600, response_cache_entries=100)
    _, raw = api_token_create(user=operator, name="cache")
    return {
        "workflow": workflow,
        "deployment": deployment,
        "backup": backup,
        "operator": operator,
        "raw": raw,
        "client": openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=raw, max_retries=0),
        "url": live_server.url,
    }


def _chat(setup: dict[str, Any], **over: Any) -> Any:
    body: dict[str, Any] = {
        "model": setup["workflow"].slug,
        "messages": [{"role": "user", "content": "what is cached?"}],
        "temperature": 0,
        **over,
    }
    return setup["client"].chat.completions.with_raw_response.create(**body)


def test_a_repeat_is_answered_from_the_cache_at_no_cost_and_records_what_it_saved(
    setup: dict[str, Any], provider: RecordingProvider
) -> None:
    first = _chat(setup)
    second = _chat(setup)
    assert provider.script.calls() == 1
    assert "x-switchyard-cache" not in first.headers and second.headers["x-switchyard-cache"] == "hit"
    assert Decimal(first.headers["x-switchyard-cost"]) == COST
    assert Decimal(second.headers["x-switchyard-cost"]) == 0
    assert Decimal(second.headers["x-switchyard-cost-avoided"]) == COST
    a, b = first.parse(), second.parse()
    assert b.choices[0].message.content == a.choices[0].message.content == "cached words"
    assert b.usage is not None and b.usage.prompt_tokens == 1000 and b.model == setup["workflow"].slug
    assert a.id != b.id  # each request has its own id

    ledger_settled()
    hit = InferenceRequest.objects.get(pk=int(b.id.removeprefix("chatcmpl-sy")))
    assert (hit.cost, hit.cost_avoided, hit.deployment_id) == (0, COST, setup["deployment"].pk)
    rows = UsageRecord.objects.filter(subject_id=str(hit.pk))
    assert [(r.amount, r.quantity, r.cost_avoided) for r in rows] == [(0, 0, COST)]
    bought = UsageRecord.objects.filter(workflow=setup["workflow"], cost_avoided__isnull=True)
    assert sum(r.amount for r in bought) == COST  # the answer was paid for once

    exported = [row for row in export_rows(filters=ExportFilters()) if row[COLUMNS.index("BilledCost")] == 0]
    assert [row[COLUMNS.index("x_CostAvoided")] for row in exported] == [COST]


def test_what_counts_as_a_repeat(setup: dict[str, Any], provider: RecordingProvider) -> None:
    _chat(setup)
    assert (
        _chat(setup, user="someone-else").headers.get("x-switchyard-cache") == "hit"
    )  # who asks: same answer
    assert _chat(setup, temperature=0.5).headers.get("x-switchyard-cache") is None  # sampling differs
    assert (
        _chat(setup, messages=[{"role": "user", "content": "other"}]).headers.get("x-switchyard-cache")
        is None
    )
    stream = setup["client"].chat.completions.create(
        model=setup["workflow"].slug,
        messages=[{"role": "user", "content": "what is cached?"}],
        temperature=0,
        stream=True,
    )
    assert (
        "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == "cached words"
    )
    keyed = setup["client"].chat.completions.with_raw_response.create(
        model=setup["workflow"].slug,
        messages=[{"role": "user", "content": "what is cached?"}],
        temperature=0,
        extra_headers={"Idempotency-Key": "k-1"},
    )
    assert keyed.headers.get("x-switchyard-cache") is None
    assert provider.script.calls() == 5  # first, temperature, other, stream, keyed


def test_the_agents_apis_are_cached_by_their_own_bodies(
    setup: dict[str, Any], provider: RecordingProvider
) -> None:
    claude = anthropic.Anthropic(base_url=setup["url"], api_key=setup["raw"], max_retries=0)
    body = {
        "model": setup["workflow"].slug,
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "what is cached?"}],
    }
    first = claude.messages.with_raw_response.create(**body)  # type: ignore[call-overload]
    again = claude.messages.with_raw_response.create(**body)  # type: ignore[call-overload]
    assert again.headers["x-switchyard-cache"] == "hit"
    assert again.parse().content[0].text == first.parse().content[0].text == "cached words"
    # The same question through another API is another entry (its answer has another shape).
    response = setup["client"].responses.with_raw_response.create(
        model=setup["workflow"].slug, input="what is cached?", max_output_tokens=100
    )
    assert response.headers.get("x-switchyard-cache") is None
    assert provider.script.calls() == 2


def test_a_new_route_version_or_another_workflow_never_reads_it(
    setup: dict[str, Any], provider: RecordingProvider
) -> None:
    _chat(setup)
    other = routed_workflow(setup["operator"], [setup["deployment"]])
    workflow_update(other, response_cache_seconds=600)
    assert _chat(setup, model=other.slug).headers.get("x-switchyard-cache") is None
    workflow_switch_primary(
        workflow=setup["workflow"], deployment=setup["backup"], author=setup["operator"], reason="test"
    )
    assert _chat(setup).headers.get("x-switchyard-cache") is None  # a switch starts a new cache
    assert _chat(setup).headers.get("x-switchyard-cache") == "hit"
    assert provider.script.calls() == 3


def test_off_by_default_and_when_turned_off(setup: dict[str, Any], provider: RecordingProvider) -> None:
    plain = routed_workflow(setup["operator"], [setup["deployment"]])
    assert plain.response_cache_seconds == 0
    for _ in range(2):
        assert _chat(setup, model=plain.slug).headers.get("x-switchyard-cache") is None
    _chat(setup)
    Workflow.objects.filter(pk=setup["workflow"].pk).update(response_cache_seconds=0)
    from inference.gateway.caller import gateway_caches_clear

    gateway_caches_clear()  # the gateway's workflow row is cached for seconds
    assert _chat(setup).headers.get("x-switchyard-cache") is None
    assert provider.script.calls() == 4


def test_a_hit_spends_none_of_the_token_limit(setup: dict[str, Any], provider: RecordingProvider) -> None:
    # A hit calls no provider, so it counts as a request but not as tokens: the key's limit of
    # 1,300 tokens a minute takes the one bought answer (1,200 reported tokens) and then every
    # repeat. Counted at the hit's 1,200 tokens, the third request would be refused (429).
    rate_limiter_reset()
    token, raw = api_token_create(user=setup["operator"], name="tpm")
    token.tpm_limit = 1300
    token.save()
    client = openai.OpenAI(base_url=f"{setup['url']}/v1", api_key=raw, max_retries=0)
    body = {
        "model": setup["workflow"].slug,
        "messages": [{"role": "user", "content": "what is cached?"}],
        "max_tokens": 50,
    }
    answers = [client.chat.completions.with_raw_response.create(**body) for _ in range(5)]
    assert [a.headers.get("x-switchyard-cache") for a in answers] == [None] + ["hit"] * 4
    assert provider.script.calls() == 1
    # Each hit's estimate is taken from what the bought answer left (100) and given back.
    assert {a.headers["x-ratelimit-remaining-tokens"] for a in answers[1:]} == {
        answers[1].headers["x-ratelimit-remaining-tokens"]
    }


@pytest.mark.parametrize("redis", [True, False], ids=["redis", "process-memory"])
def test_the_ttl_and_the_size_bound(
    setup: dict[str, Any], provider: RecordingProvider, settings: Any, monkeypatch: Any, redis: bool
) -> None:
    if not redis:
        settings.REDIS_URL = ""
    workflow_update(setup["workflow"], response_cache_entries=2)
    from inference.gateway.caller import gateway_caches_clear

    gateway_caches_clear()
    for word in ("a", "b", "c"):  # the third evicts the oldest
        _chat(setup, messages=[{"role": "user", "content": word}])
    assert (
        _chat(setup, messages=[{"role": "user", "content": "c"}]).headers.get("x-switchyard-cache") == "hit"
    )
    assert _chat(setup, messages=[{"role": "user", "content": "a"}]).headers.get("x-switchyard-cache") is None
    calls = provider.script.calls()
    # Ten minutes later (the TTL), the answers are no longer served.
    now = exact.time.time()
    monkeypatch.setattr(exact.time, "time", lambda: now + 601)
    assert _chat(setup, messages=[{"role": "user", "content": "c"}]).headers.get("x-switchyard-cache") is None
    assert provider.script.calls() == calls + 1


def test_a_workflow_keeping_prompts_caches_no_longer_than_it_keeps_them(setup: dict[str, Any]) -> None:
    workflow: Workflow = setup["workflow"]
    workflow_update(
        workflow, response_cache_seconds=30 * 86_400, retain_prompts=True, prompt_retention_days=2
    )
    assert cache.cache_seconds(workflow) == 2 * 86_400
    workflow_update(workflow, retain_prompts=False, prompt_retention_days=None)
    assert cache.cache_seconds(workflow) == 30 * 86_400


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"response_cache_seconds": -1}, "response_cache_seconds"),
        ({"response_cache_seconds": 10**9}, "response_cache_seconds"),
        ({"response_cache_entries": 0, "response_cache_seconds": 60}, "response_cache_entries"),
        ({"response_cache_entries": "many"}, "response_cache_entries"),
    ],
)
def test_bad_cache_settings_are_refused_naming_the_field(
    setup: dict[str, Any], admin_user: User, change: dict[str, Any], field: str
) -> None:
    from tests.factories import api_client

    response = api_client(admin_user).patch(
        f"/api/workflows/{setup['workflow'].slug}/", change, format="json"
    )
    assert response.status_code == 400 and field in response.json()
    setup["workflow"].refresh_from_db()
    assert setup["workflow"].response_cache_seconds == 600


def test_the_dashboard_shows_what_the_cache_saved(setup: dict[str, Any], auditor: User) -> None:
    _chat(setup)
    _chat(setup)
    _chat(setup)
    ledger_settled()
    page = Client()
    page.force_login(auditor)
    html = page.get("/billing/").content.decode()
    card = html[html.index('id="saved-by-cache"') :][:600]
    assert f"{2 * COST:f}".rstrip("0") in card


def test_a_workflow_moved_to_another_team_starts_an_empty_cache_and_garbage_is_a_miss(
    setup: dict[str, Any], provider: RecordingProvider
) -> None:
    from inference.gateway.caller import gateway_caches_clear
    from tests.factories import make_team

    _chat(setup)
    workflow_update(setup["workflow"], team=make_team("elsewhere"))
    gateway_caches_clear()
    assert _chat(setup).headers.get("x-switchyard-cache") is None
    workflow = Workflow.objects.get(pk=setup["workflow"].pk)
    for key in exact._stores[next(iter(exact._stores))].redis.scan_iter(f"{exact.PREFIX}{workflow.pk}:*"):
        if b":idx:" not in key:
            exact._stores[next(iter(exact._stores))].redis.set(key, b"not json")
    assert _chat(setup).headers.get("x-switchyard-cache") is None  # a corrupt entry: a miss, not a 500
    assert _chat(setup).headers.get("x-switchyard-cache") == "hit"  # and it was overwritten
    assert provider.script.calls() == 3
