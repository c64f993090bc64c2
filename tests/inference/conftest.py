"""Fixtures for the inference tests: loopback providers, a serve_model process, clean breakers."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from bench.mockprovider import Behaviour, MockProviderServer
from inference.adapters.http_client import close_all
from inference.breaker import breakers as breaker
from inference.gateway.caller import gateway_caches_clear
from inference.selectors import rolling_caches_clear, route_cache_invalidate
from tests.inference.recording_provider import RecordingProvider


@pytest.fixture(autouse=True)
def _clean_inference_state() -> Iterator[None]:
    """Breakers, latency samples and caches start empty in every test (Redis db of this run)."""

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
    """Start loopback OpenAI-compatible providers: `mock_provider(status=503)`."""
    servers: list[MockProviderServer] = []

    def start(**behaviour: Any) -> MockProviderServer:
        server = MockProviderServer(Behaviour(**behaviour)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def served(transactional_db: Any, tmp_path: Path) -> Iterator[tuple[Any, str, str]]:
    """(registered model, its artifact URI, the base URL of a running serve_model process)."""
    import torch  # slow to import: only the tests that serve a model need it

    from storage.artifacts import model_artifact_write
    from tests.factories import make_model
    from tests.integration.processes import session_database_url, stop_process
    from training.engine.config import ModelConfig
    from training.engine.model import GPT

    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=1, n_embd=16, n_head=2, block_size=32)
    uri = model_artifact_write(
        store_url=f"file://{tmp_path}",
        key="models/tiny.bin",
        model_config=dataclasses.asdict(cfg),
        params=GPT(cfg).state_dict(),
    )
    model = make_model(slug="tiny-gpt", artifact_uri=uri, context_length=32)
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            str(Path(settings.BASE_DIR) / "manage.py"),
            "serve_model",
            "--model",
            model.slug,
            "--port",
            str(port),
        ],
        env={**os.environ, "DATABASE_URL": session_database_url()},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=1).read()  # noqa: S310 (loopback)
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    output = process.stdout.read().decode() if process.stdout else ""
                    raise AssertionError(f"serve_model did not start: {output}") from None
                time.sleep(0.2)
        yield model, uri, f"{base}/v1"
    finally:
        stop_process(process, what="serve_model")


@pytest.fixture
def provider() -> Iterator[RecordingProvider]:
    """A loopback OpenAI-compatible provider that records every body it receives
    (tests/inference/recording_provider.py)."""
    server = RecordingProvider()
    yield server
    server.stop()
