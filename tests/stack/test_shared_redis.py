"""The one Redis client factory (registry.shared_redis.client) and the one generation counter
(registry.shared_redis.generation) that the route plans and the token grants both move."""

from __future__ import annotations

import multiprocessing
import socket
import uuid
from typing import Any

import pytest
from django.conf import settings as django_settings

from inference import selectors
from inference.breaker.redis_breakers import RedisBreakers
from inference.ratelimit.redis_counters import RedisWindows
from registry.auth import version as auth_version_module
from registry.auth.version import AUTH_VERSION_KEY, auth_version
from registry.shared_redis.client import redis_client
from registry.shared_redis.generation import GenerationCounter
from stack import metrics


@pytest.fixture
def dead_redis_url() -> str:
    """A loopback port that nothing listens on (connections are refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def _timeouts(client: Any) -> tuple[float, float]:
    kwargs = client.connection_pool.connection_kwargs
    return kwargs["socket_timeout"], kwargs["socket_connect_timeout"]


def test_one_client_per_url_and_timeout_in_a_process(dead_redis_url: str) -> None:
    client = redis_client(dead_redis_url, timeout=1.0)
    assert redis_client(dead_redis_url, timeout=1.0) is client
    faster = redis_client(dead_redis_url, timeout=0.5)
    assert faster is not client
    assert _timeouts(client) == (1.0, 1.0)
    assert _timeouts(faster) == (0.5, 0.5)
    assert redis_client(dead_redis_url.replace("/0", "/1"), timeout=1.0) is not client


def test_every_user_gets_its_client_from_the_factory_with_its_own_timeout(
    dead_redis_url: str, settings: Any
) -> None:
    # The rate-limit counters answer every /v1 request: half a second; the others a second.
    assert RedisWindows(dead_redis_url, 60.0)._redis is redis_client(dead_redis_url, timeout=0.5)
    assert RedisBreakers(dead_redis_url).redis is redis_client(dead_redis_url, timeout=1.0)
    settings.REDIS_URL = dead_redis_url
    assert selectors._Generation().counter._redis is redis_client(dead_redis_url, timeout=1.0)
    assert auth_version_module._AuthVersion().counter._redis is redis_client(dead_redis_url, timeout=1.0)


def test_the_metrics_queue_depths_read_the_broker_through_the_factory(
    dead_redis_url: str, settings: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[tuple[str, float]] = []

    def recording_client(url: str, *, timeout: float) -> Any:
        asked.append((url, timeout))
        return redis_client(url, timeout=timeout)

    monkeypatch.setattr(metrics, "redis_client", recording_client)
    settings.CELERY_BROKER_URL = dead_redis_url
    families: list[Any] = []
    metrics._queue_depths(families, [])
    assert asked == [(dead_redis_url, 1.0)]
    assert families == []  # the broker did not answer: no queue depths in this scrape
    assert "the broker did not answer" in caplog.text


def test_route_generation_and_authorisation_version_share_one_counter(settings: Any) -> None:
    settings.REDIS_URL = ""
    route, grants = selectors._Generation(), auth_version_module._AuthVersion()
    assert type(route.counter) is GenerationCounter
    assert type(grants.counter) is GenerationCounter
    assert (route.counter.key, grants.counter.key) == (selectors.GENERATION_KEY, AUTH_VERSION_KEY)


def test_without_redis_the_route_generation_counts_locally_and_grants_have_no_version(
    settings: Any,
) -> None:
    settings.REDIS_URL = ""
    route, grants = selectors._Generation(), auth_version_module._AuthVersion()
    assert not route.shared and not grants.shared
    assert route.read() == 0
    route.bump()
    route.bump()
    assert route.read() == 2
    grants.bump()
    assert grants.read() is None


def test_an_unreachable_redis_is_reported_and_reads_as_unknown(dead_redis_url: str) -> None:
    reports: list[str] = []
    counter = GenerationCounter(
        "sy:test", url=dead_redis_url, name="test counter", on_unreachable=reports.append
    )
    assert counter.shared
    assert counter.read() is None
    counter.bump()  # does not raise
    assert reports == ["read the test counter", "move the test counter"]
    assert counter.local == 1


def test_an_unreachable_redis_drops_the_cached_grants(dead_redis_url: str, settings: Any) -> None:
    settings.REDIS_URL = dead_redis_url
    grants = auth_version_module._AuthVersion()
    dropped: list[bool] = []

    def drop() -> None:
        dropped.append(True)

    auth_version_module.grant_cache_register(drop)
    try:
        assert grants.read() is None
        assert dropped == [True]
    finally:
        auth_version_module._cache_droppers.remove(drop)


def _incr_in_child(url: str, key: str) -> None:
    redis_client(url, timeout=1.0).incr(key)


@pytest.mark.redis
def test_a_bump_reaches_the_counter_in_redis_and_a_forked_child_shares_the_client() -> None:
    url = django_settings.REDIS_URL
    key = f"sy:test:{uuid.uuid4().hex}"
    client = redis_client(url, timeout=1.0)
    counter = GenerationCounter(key, url=url, name="test counter", on_unreachable=pytest.fail)
    try:
        assert counter.read() == b""  # a missing key: a value no INCR leaves
        counter.bump()
        assert counter.read() == b"1"
        # The parent's client (and its open connection) goes through a fork: the child's pool
        # opens its own connection instead of writing into the parent's socket.
        child = multiprocessing.get_context("fork").Process(target=_incr_in_child, args=(url, key))
        child.start()
        child.join(10)
        assert child.exitcode == 0
        assert counter.read() == b"2"
        assert client.ping()
    finally:
        client.delete(key)


@pytest.mark.redis
def test_the_auth_version_reads_what_the_shared_counter_wrote() -> None:
    before = auth_version().read()
    assert before is not None
    auth_version().bump()
    after = auth_version().read()
    assert after is not None and int(after) == int(before or b"0") + 1
