"""While the breakers' Redis (REDIS_URL) is unreachable, routing goes on: breakers fail open,
route plans are rebuilt from the database, and saves that move the route generation succeed."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import pytest
from django.contrib.auth.models import User

from bench.mockprovider import MockProviderServer
from inference import selectors
from inference.adapters.base import ChatMessage, ChatRequest
from inference.breaker import breakers as breaker
from inference.breaker.redis_breakers import RedisBreakers
from inference.breaker.state import GENERATION_UNKNOWN, breaker_settings
from inference.models import InferenceRequest
from inference.router.entry import route
from inference.router.policy import Peek, Policy, Strategy
from tests.inference.helpers import priced_deployment, routed_workflow

PING = ChatRequest(messages=[ChatMessage(role="user", content="ping")])


@pytest.fixture
def dead_redis_url() -> str:
    """A loopback port that nothing listens on (connections are refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


@pytest.fixture
def unreachable_redis(dead_redis_url: str, settings: object) -> Iterator[RedisBreakers]:
    """The process's breaker store and route generation pointed at the dead port."""
    saved = breaker._breakers, selectors._gen
    settings.REDIS_URL = dead_redis_url  # type: ignore[attr-defined]
    store = RedisBreakers(dead_redis_url)
    breaker._breakers = store
    selectors._gen = selectors._Generation()
    try:
        yield store
    finally:
        breaker._breakers, selectors._gen = saved


def test_each_breaker_call_fails_open(unreachable_redis: RedisBreakers) -> None:
    cfg = breaker_settings()
    assert unreachable_redis.peek([1, 2], now=0.0, cfg=cfg) == [Peek.CLOSED, Peek.CLOSED]
    assert unreachable_redis.peek_with_generation("sy:routegen", [1], now=0.0, cfg=cfg) == (
        GENERATION_UNKNOWN,
        [Peek.CLOSED],
    )
    assert unreachable_redis.record(1, ok=False, latency_ms=5.0, now=0.0, cfg=cfg) == ("closed", "")
    assert unreachable_redis.claim_probe(1, now=0.0, cfg=cfg) is False
    assert unreachable_redis.claim_once("demotion:1", ttl_s=60) is False
    assert unreachable_redis.state(1) == {}
    assert unreachable_redis.latencies([1]) == {1: []}


def test_the_route_generation_reads_unknown_and_a_bump_does_not_raise(
    unreachable_redis: RedisBreakers,
) -> None:
    generation = selectors.generation()
    assert generation.read() == GENERATION_UNKNOWN
    generation.bump()  # a save (inference.signals) must not fail because Redis is away
    plan = selectors.RoutePlan(
        workflow_id=1,
        policy_id=None,
        version=1,
        policy=Policy(strategy=Strategy.PRIORITY),
        entries=[],
        generation=GENERATION_UNKNOWN,
    )
    assert not plan.is_current(GENERATION_UNKNOWN, shared=True)


@pytest.mark.django_db
def test_requests_are_answered_and_recorded_while_redis_is_unreachable(
    admin_user: User, mock_provider: Callable[..., MockProviderServer], unreachable_redis: RedisBreakers
) -> None:
    server = mock_provider(tokens_in=10, tokens_out=5)
    primary = priced_deployment(server)
    workflow = routed_workflow(admin_user, [primary])  # its save bumps the (unreachable) generation
    results = [route(workflow=workflow, request=PING) for _ in range(3)]
    assert [r.ok for r in results] == [True, True, True]
    assert InferenceRequest.objects.filter(workflow=workflow, status="succeeded").count() == 3
