"""Fixtures for the decisions tests: loopback providers and clean router state per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from inference import breaker
from inference.adapters.openai_compat import close_all
from inference.gateway import gateway_caches_clear
from inference.mockprovider import Behaviour, MockProviderServer
from inference.selectors import rolling_caches_clear, route_cache_invalidate


@pytest.fixture(autouse=True)
def _clean_router_state() -> Iterator[None]:
    """Breakers, latency samples and route caches start empty (Redis db of this run)."""

    def clean() -> None:
        store = breaker.breakers()
        if isinstance(store, breaker.RedisBreakers):
            keys = list(store.redis.scan_iter("sy:*"))
            if keys:
                store.redis.delete(*keys)
        else:
            store._state.clear()
            store._lat.clear()
            store._once.clear()
        route_cache_invalidate()
        rolling_caches_clear()
        gateway_caches_clear()

    clean()
    yield
    clean()
    close_all()


@pytest.fixture
def mock_provider() -> Iterator[Callable[..., MockProviderServer]]:
    """Start loopback OpenAI-compatible providers: `mock_provider(tokens_in=1000)`."""
    servers: list[MockProviderServer] = []

    def start(**behaviour: Any) -> MockProviderServer:
        server = MockProviderServer(Behaviour(**behaviour)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
