"""/metrics under gunicorn with several workers: every scrape, whichever worker answers it, counts
every worker's requests, and a worker that died keeps its requests counted (prometheus-client's
multiprocess mode, set up by stack/gunicorn_conf.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from prometheus_client.parser import text_string_to_metric_families

from bench.gateway.proc_stat import child_pids
from bench.mockprovider import MockProviderServer
from registry.services import api_token_create
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.integration.processes import session_database_url, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

WORKERS = 2
CLIENTS = 8
PER_CLIENT = 5
METRICS_TOKEN = "metrics-token-for-the-workers-test"
GUNICORN_CONF = Path(settings.BASE_DIR) / "stack" / "gunicorn_conf.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(transactional_db: Any, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """gunicorn with the production configuration; its metrics directory set by the operator and
    holding a stale file from an earlier run."""
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    (metrics_dir / "counter_1.db").write_bytes(b"left by an earlier server")
    port = _free_port()
    env = {
        **os.environ,
        "DATABASE_URL": session_database_url(),
        "DEBUG": "0",
        "SWITCHYARD_WEB_BIND": f"127.0.0.1:{port}",
        "SWITCHYARD_WEB_WORKERS": str(WORKERS),
        "SWITCHYARD_WEB_THREADS": "2",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "SWITCHYARD_METRICS_TOKEN": METRICS_TOKEN,
    }
    process = subprocess.Popen(  # noqa: S603 (our interpreter, fixed arguments)
        [sys.executable, "-m", "gunicorn", "-c", str(GUNICORN_CONF), "stack.wsgi:application"],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=(tmp_path / "gunicorn.log").open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert process.poll() is None, (tmp_path / "gunicorn.log").read_text()
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as answer:  # noqa: S310 (loopback)
                return bool(answer.status == 200)
        except OSError:
            return False

    try:
        wait_until(healthy, timeout=60, what="gunicorn to answer /healthz")
        wait_until(lambda: len(child_pids(process.pid)) == WORKERS, timeout=60, what="both workers")
        yield process, url, metrics_dir
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def _requests_counted(url: str, workflow: str) -> float:
    headers = {"Authorization": f"Bearer {METRICS_TOKEN}"}
    scrape = urllib.request.Request(f"{url}/metrics", headers=headers)  # noqa: S310 (loopback)
    with urllib.request.urlopen(scrape, timeout=10) as answer:  # noqa: S310 (loopback)
        text = answer.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "switchyard_gateway_requests_total" and sample.labels["workflow"] == workflow:
                total += sample.value
    return total


def test_every_scrape_counts_every_workers_requests_and_a_dead_workers_too(
    server: tuple[subprocess.Popen[bytes], str, Path],
    viewer: User,
    mock_provider: Callable[..., MockProviderServer],
) -> None:
    process, url, metrics_dir = server
    assert not (metrics_dir / "counter_1.db").exists()  # the stale file was cleared at start
    provider = mock_provider(delay_ms=30)  # slow enough that concurrent clients reach both workers
    workflow = routed_workflow(viewer, [priced_deployment(provider)])
    _, token = api_token_create(user=viewer, name="metrics-workers")
    body = json.dumps({"model": workflow.slug, "messages": [{"role": "user", "content": "ping"}]}).encode()
    statuses: list[int] = []

    def client() -> None:
        for _ in range(PER_CLIENT):
            request = urllib.request.Request(  # noqa: S310 (loopback)
                f"{url}/v1/chat/completions",
                data=body,
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 (loopback)
                statuses.append(answer.status)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sent = CLIENTS * PER_CLIENT
    assert statuses == [200] * sent
    # Both workers served some of them: each wrote its own values file.
    writers = {p.stem.rsplit("_", 1)[1] for p in metrics_dir.glob("counter_*.db")}
    assert len(writers) >= WORKERS, writers
    # Each scrape is a new connection, answered by either worker: all show every request.
    assert [_requests_counted(url, workflow.slug) for _ in range(6)] == [sent] * 6

    victim = child_pids(process.pid)[0]
    os.kill(victim, signal.SIGKILL)
    wait_until(
        lambda: len(child_pids(process.pid)) == WORKERS and victim not in child_pids(process.pid),
        timeout=60,
        what="gunicorn to replace the killed worker",
    )
    assert [_requests_counted(url, workflow.slug) for _ in range(4)] == [sent] * 4
