"""Rate limits on /v1 per API key and per workflow (inference.ratelimit.limits): a refusal is a 429 with
Retry-After, every answer under a limit carries OpenAI's x-ratelimit-* headers, tokens are
counted with the estimate and corrected with the reported usage, and an unreachable Redis lets
requests through unless the key fails closed. Counters in the Redis of this run (REDIS_URL)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.utils import timezone

from bench.mockprovider import MockProviderServer
from inference.ratelimit.limits import rate_limiter_reset
from registry.models import Workflow
from registry.services import api_token_create
from tests.factories import make_team
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db(transaction=True)
# The counters live in Redis (REDIS_URL): without it these tests would check the in-process store.
needs_redis = pytest.mark.redis
Start = Callable[..., MockProviderServer]
# A short "minute", so that waiting for the window to pass takes seconds; long enough that the
# 60 requests of the RPM test all fall into one window on a loaded machine.
WINDOW_S = 10.0
# The team test's 5 requests take well under a second; its Retry-After is waited out for real.
TEAM_WINDOW_S = 3.0


@pytest.fixture(autouse=True)
def _short_window() -> Iterator[None]:
    with override_settings(RATE_LIMIT_WINDOW_SECONDS=WINDOW_S):
        rate_limiter_reset()
        yield
    rate_limiter_reset()


@pytest.fixture
def workflow(viewer: User, mock_provider: Start) -> Workflow:
    return routed_workflow(viewer, [priced_deployment(mock_provider(text="ok"))])


def _client(user: User, **limits: Any) -> Client:
    token, raw = api_token_create(user=user, name="limited")
    if limits:
        for name, value in limits.items():
            setattr(token, name, value)
        token.save()
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def _ask(client: Client, workflow: Workflow, *, max_tokens: int | None = None) -> Any:
    doc: dict[str, Any] = {"model": workflow.slug, "messages": [{"role": "user", "content": "ping"}]}
    if max_tokens is not None:
        doc["max_tokens"] = max_tokens
    return client.post("/v1/chat/completions", json.dumps(doc), content_type="application/json")


@needs_redis
def test_a_key_of_60_rpm_gets_429_on_the_61st_request_with_a_retry_after_within_the_window(
    viewer: User, workflow: Workflow
) -> None:
    client = _client(viewer, rpm_limit=60)
    for n in range(60):
        response = _ask(client, workflow)
        assert response.status_code == 200, n
        assert response["x-ratelimit-remaining-requests"] == str(59 - n)
    refused = _ask(client, workflow)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused["x-ratelimit-limit-requests"] == "60"
    assert refused["x-ratelimit-remaining-requests"] == "0"
    assert 1 <= int(refused["Retry-After"]) <= WINDOW_S


def test_in_process_a_refused_key_passes_once_its_retry_after_has_passed(
    viewer: User, workflow: Workflow
) -> None:
    # The in-process store reads the clock this test moves; Redis keeps its own (TIME), so the
    # Redis case waits out a short window for real (the team test below).
    with override_settings(RATE_LIMIT_REDIS_URL=""), time_machine.travel(timezone.now(), tick=True) as clock:
        rate_limiter_reset()
        client = _client(viewer, rpm_limit=60)
        for n in range(60):
            assert _ask(client, workflow).status_code == 200, n
        refused = _ask(client, workflow)
        assert refused.status_code == 429
        retry_after = int(refused["Retry-After"])
        assert 1 <= retry_after <= WINDOW_S
        # Retry-After is the wait rounded up to whole seconds: 1.5 s short of it is still early.
        clock.shift(retry_after - 1.5)
        assert _ask(client, workflow).status_code == 429
        clock.shift(1.5)
        assert _ask(client, workflow).status_code == 200


@needs_redis
def test_a_token_limit_counts_the_estimate_and_corrects_it_with_the_reported_usage(
    viewer: User, workflow: Workflow
) -> None:
    # "ping" is 1 token, its message 4 and the reply's priming 3 (inference.admission), plus
    # max_tokens: 88 estimated; the provider reports 10.
    client = _client(viewer, tpm_limit=100)
    first = _ask(client, workflow, max_tokens=80)
    assert first.status_code == 200
    assert first["x-ratelimit-limit-tokens"] == "100"
    assert first["x-ratelimit-remaining-tokens"] == "12"
    # Corrected to 10: another 88 fits (without the correction, 176 would not).
    second = _ask(client, workflow, max_tokens=80)
    assert second.status_code == 200
    assert second["x-ratelimit-remaining-tokens"] == "2"
    third = _ask(client, workflow, max_tokens=80)
    assert third.status_code == 429
    assert int(third["Retry-After"]) >= 1
    assert "x-ratelimit-limit-requests" not in third  # no request limit on this key


@needs_redis
def test_a_request_larger_than_the_token_limit_is_refused_without_a_retry_after(
    viewer: User, workflow: Workflow
) -> None:
    refused = _ask(_client(viewer, tpm_limit=100), workflow, max_tokens=200)
    assert refused.status_code == 429
    assert "larger than the rate limit" in refused.json()["error"]["message"]
    assert "Retry-After" not in refused


@needs_redis
def test_a_workflow_limit_applies_to_every_key_together(viewer: User, workflow: Workflow) -> None:
    workflow.rpm_limit = 2
    workflow.save()
    first, second = _client(viewer), _client(viewer)
    assert _ask(first, workflow).status_code == 200
    answer = _ask(second, workflow)
    assert answer.status_code == 200
    assert answer["x-ratelimit-remaining-requests"] == "0"
    assert _ask(first, workflow).status_code == 429
    assert _ask(second, workflow).status_code == 429


@needs_redis
def test_the_key_and_the_workflow_limits_both_apply_and_the_tightest_is_reported(
    viewer: User, workflow: Workflow
) -> None:
    workflow.rpm_limit = 5
    workflow.tpm_limit = 10_000
    workflow.save()
    client = _client(viewer, rpm_limit=1, tpm_limit=500)
    answer = _ask(client, workflow)
    assert answer.status_code == 200
    assert answer["x-ratelimit-limit-requests"] == "1"
    assert answer["x-ratelimit-remaining-requests"] == "0"
    assert answer["x-ratelimit-limit-tokens"] == "500"
    assert answer["x-ratelimit-reset-requests"].endswith("s")
    assert _ask(client, workflow).status_code == 429
    # The refused request was not counted against the workflow: another key has 4 left.
    other = _ask(_client(viewer), workflow)
    assert other.status_code == 200
    assert other["x-ratelimit-remaining-requests"] == "3"


@needs_redis
def test_no_limit_no_headers(viewer: User, workflow: Workflow) -> None:
    answer = _ask(_client(viewer), workflow)
    assert answer.status_code == 200
    assert not [h for h in answer.headers if h.lower().startswith("x-ratelimit")]


@needs_redis
def test_streaming_and_embeddings_are_limited_too(viewer: User, workflow: Workflow) -> None:
    client = _client(viewer, rpm_limit=1)
    doc = {"model": workflow.slug, "messages": [{"role": "user", "content": "ping"}], "stream": True}
    streamed = client.post("/v1/chat/completions", json.dumps(doc), content_type="application/json")
    assert streamed.status_code == 200
    assert streamed["x-ratelimit-remaining-requests"] == "0"
    b"".join(streamed.streaming_content)  # type: ignore[attr-defined]
    again = client.post("/v1/chat/completions", json.dumps(doc), content_type="application/json")
    assert again.status_code == 429
    embed = client.post(
        "/v1/embeddings", json.dumps({"model": workflow.slug, "input": "x"}), content_type="application/json"
    )
    assert embed.status_code == 429


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again once the socket is


def test_with_redis_unreachable_a_key_fails_open_unless_it_fails_closed(
    viewer: User, workflow: Workflow
) -> None:
    with override_settings(RATE_LIMIT_REDIS_URL=f"redis://127.0.0.1:{_closed_port()}/0"):
        rate_limiter_reset()
        open_key = _client(viewer, rpm_limit=1)
        for _ in range(3):
            answer = _ask(open_key, workflow)
            assert answer.status_code == 200
            assert "x-ratelimit-limit-requests" not in answer
        closed = _ask(_client(viewer, rpm_limit=1, rate_limit_fail_closed=True), workflow)
        assert closed.status_code == 503
        assert closed.json()["error"]["code"] == "rate_limit_unavailable"
        assert "fail closed" in closed.json()["error"]["message"]


def test_without_a_redis_url_the_limits_hold_in_process(viewer: User, workflow: Workflow) -> None:
    with override_settings(RATE_LIMIT_REDIS_URL=""):
        rate_limiter_reset()
        client = _client(viewer, rpm_limit=2)
        assert _ask(client, workflow).status_code == 200
        assert _ask(client, workflow)["x-ratelimit-remaining-requests"] == "0"
        refused = _ask(client, workflow)
        assert refused.status_code == 429
        assert int(refused["Retry-After"]) >= 1


@needs_redis
def test_a_teams_rpm_counts_every_key_of_the_team_and_the_keys_own_limit_still_applies(
    operator: User, mock_provider: Start, settings: Any
) -> None:
    # A window of a few seconds, waited out for real: Redis counts time by its own clock.
    settings.RATE_LIMIT_WINDOW_SECONDS = TEAM_WINDOW_S
    rate_limiter_reset()
    team = make_team("search", rpm_limit=3)
    workflow = routed_workflow(operator, [priced_deployment(mock_provider(text="ok"))], team=team)
    _, first_raw = api_token_create(user=operator, name="a", team=team, rpm_limit=60)
    _, second_raw = api_token_create(user=operator, name="b", team=team, rpm_limit=1)
    first = Client(HTTP_AUTHORIZATION=f"Bearer {first_raw}")
    second = Client(HTTP_AUTHORIZATION=f"Bearer {second_raw}")
    assert _ask(second, workflow).status_code == 200
    own = _ask(second, workflow)  # its own limit of 1, with room left in the team's
    assert own.status_code == 429 and "for this key" in own.json()["error"]["message"]
    assert _ask(first, workflow).status_code == 200
    last = _ask(first, workflow)
    assert last.status_code == 200
    # The team's 3 are spent (the refused request counted nowhere): the key's 60 do not help.
    assert last["x-ratelimit-limit-requests"] == "3" and last["x-ratelimit-remaining-requests"] == "0"
    refused = _ask(first, workflow)
    assert refused.status_code == 429
    assert "3 requests per minute for this team" in refused.json()["error"]["message"]
    retry_after = int(refused["Retry-After"])
    assert 1 <= retry_after <= TEAM_WINDOW_S
    time.sleep(retry_after)
    assert _ask(first, workflow).status_code == 200
