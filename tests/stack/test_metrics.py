"""/metrics: the Prometheus text format after a routed request, a failover and a training chunk,
and who may scrape it (a bearer token, allowed networks, loopback by default)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from bench.mockprovider import Behaviour, MockProviderServer
from billing.models import Budget
from billing.rollups import rollups_update
from inference.adapters.base import ChatMessage, ChatRequest
from inference.breaker import breakers as breaker
from inference.router.entry import route, route_stream
from inference.router.errors import RouteResult
from inference.selectors import route_cache_invalidate
from registry.models import Cluster, Deployment, Workflow
from registry.services import api_token_create
from stack.metrics import stack_collector
from tests.factories import make_cluster, tiny_run_config
from tests.inference.helpers import priced_deployment, routed_workflow
from training import orchestrator, services
from training.models import TrainingLearner, TrainingRun

pytestmark = pytest.mark.django_db
PING = ChatRequest(messages=(ChatMessage("user", "ping"),))
TOKEN = "metrics-token-for-tests-0123456789"


@pytest.fixture
def providers() -> Iterator[tuple[MockProviderServer, MockProviderServer]]:
    """A primary that answers 503 and a healthy fallback, on loopback."""
    failing = MockProviderServer(Behaviour(status=503)).start()
    healthy = MockProviderServer(Behaviour(tokens_in=12, tokens_out=7)).start()
    store = breaker.breakers()
    if isinstance(store, breaker.RedisBreakers):
        keys = list(store.redis.scan_iter("sy:*"))
        if keys:
            store.redis.delete(*keys)
    route_cache_invalidate()
    yield failing, healthy
    failing.stop()
    healthy.stop()


@pytest.fixture(autouse=True)
def _fresh_scrape(settings: Any, tmp_path: Path) -> Iterator[None]:
    settings.OBJECT_STORE_URL = f"file://{tmp_path}"  # the training run's deltas and versions
    stack_collector.clear()
    yield
    stack_collector.clear()


def _scrape(client: Client | None = None, **extra: Any) -> dict[str, Any]:
    """The samples of GET /metrics, parsed by prometheus-client's text parser: name -> [(labels, value)].
    Without `client`, a scrape holding the token (as Prometheus in docker-compose.yml)."""
    if client is None:
        with override_settings(METRICS_TOKEN=TOKEN):
            response = Client(HTTP_AUTHORIZATION=f"Bearer {TOKEN}").get("/metrics", **extra)
    else:
        response = client.get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def _value(samples: dict[str, Any], name: str, /, **labels: str) -> float:
    matches = [
        v for found, v in samples.get(name, []) if all(found.get(k) == want for k, want in labels.items())
    ]
    assert len(matches) == 1, (name, labels, samples.get(name))
    return float(matches[0])


def _placed_run() -> TrainingRun:
    for price in ("1.250000", "3.000000"):
        cluster = make_cluster(price=Decimal(price), accelerator_count=4, capacity=2)
        Cluster.objects.filter(pk=cluster.pk).update(status="healthy", last_heartbeat_at=timezone.now())
    run = services.training_run_create(config=tiny_run_config(), created_by=None, name="metrics")
    services.training_run_place(run_id=run.pk)
    run.refresh_from_db()
    assert run.state == TrainingRun.State.RUNNING, run.reason
    return run


@dataclass
class Populated:
    workflow: Workflow
    primary: Deployment
    fallback: Deployment
    result: RouteResult
    run: TrainingRun
    learner: TrainingLearner


def populate_every_series(owner: User, failing: MockProviderServer, healthy: MockProviderServer) -> Populated:
    """A request that fails over, under a workflow budget; a training run with one chunk trained;
    the rollups folded."""
    primary, fallback = priced_deployment(failing), priced_deployment(healthy)
    workflow = routed_workflow(owner, [primary, fallback])
    Budget.objects.create(
        name=f"budget-{workflow.slug}",
        scope=Budget.Scope.WORKFLOW,
        workflow=workflow,
        limit_amount=Decimal("10"),
    )
    result = route(workflow=workflow, request=PING)  # the primary fails, the fallback answers
    assert result.ok and result.deployment_slug == fallback.slug
    run = _placed_run()
    learner = TrainingLearner.objects.get(run=run, index=0)
    orchestrator.learner_chunk_execute(learner_id=learner.pk, generation=0, seq=0, worker_hostname="w@1")
    learner.refresh_from_db()
    assert learner.tokens > 0
    rollups_update()
    stack_collector.clear()
    return Populated(workflow, primary, fallback, result, run, learner)


def populated_scrape(owner: User) -> dict[str, Any]:
    """/metrics's samples once every series has something to show (tests/stack/test_docker_compose.py)."""
    failing = MockProviderServer(Behaviour(status=503)).start()
    healthy = MockProviderServer(Behaviour()).start()
    try:
        populate_every_series(owner, failing, healthy)
        return _scrape()
    finally:
        failing.stop()
        healthy.stop()


def test_metrics_show_the_gateway_failover_spend_budget_breaker_queue_cluster_and_training_series(
    admin_user: User, providers: tuple[MockProviderServer, MockProviderServer]
) -> None:
    done = populate_every_series(admin_user, *providers)
    workflow, primary, fallback, result, run, learner = (
        done.workflow,
        done.primary,
        done.fallback,
        done.result,
        done.run,
        done.learner,
    )
    samples = _scrape()
    wf, ok, bad = workflow.slug, fallback.slug, primary.slug
    # Counted on the request path.
    assert (
        _value(samples, "switchyard_gateway_requests_total", workflow=wf, deployment=ok, status="succeeded")
        == 1
    )
    assert (
        _value(samples, "switchyard_gateway_attempts_total", workflow=wf, deployment=bad, outcome="retryable")
        == 1
    )
    assert _value(samples, "switchyard_gateway_attempts_total", workflow=wf, deployment=ok, outcome="ok") == 1
    assert (
        _value(
            samples,
            "switchyard_gateway_request_duration_seconds_count",
            workflow=wf,
            deployment=ok,
            status="succeeded",
        )
        == 1
    )
    assert (
        _value(
            samples,
            "switchyard_gateway_attempt_duration_seconds_count",
            workflow=wf,
            deployment=bad,
            outcome="retryable",
        )
        == 1
    )
    assert _value(samples, "switchyard_gateway_tokens_total", workflow=wf, deployment=ok, type="input") == 12
    assert _value(samples, "switchyard_gateway_tokens_total", workflow=wf, deployment=ok, type="output") == 7
    # Read at scrape time.
    assert _value(samples, "switchyard_failover_events_total", kind="inference", code="http_5xx") == 1
    assert _value(samples, "switchyard_breaker_state", deployment=bad) == 0  # one failure: still closed
    spend = _value(
        samples, "switchyard_spend_today", workflow=wf, provider=fallback.provider.slug, currency="USD"
    )
    assert Decimal(str(spend)) == result.cost
    assert _value(samples, "switchyard_spend_month_to_date", workflow=wf, currency="USD") == spend
    assert (
        _value(samples, "switchyard_budget_limit", budget=f"budget-{wf}", scope="workflow", target=wf) == 10
    )
    remaining = _value(samples, "switchyard_budget_remaining", budget=f"budget-{wf}")
    assert Decimal(str(remaining)) == Decimal("10") - result.cost
    assert _value(samples, "switchyard_queue_depth", queue="control") >= 0
    for cluster in Cluster.objects.filter(status="healthy"):
        assert _value(samples, "switchyard_cluster_heartbeat_age_seconds", cluster=cluster.slug) >= 0
        assert _value(samples, "switchyard_cluster_status", cluster=cluster.slug, status="healthy") == 1
        assert _value(samples, "switchyard_queue_depth", queue=f"cluster.{cluster.slug}") >= 0
    run_labels = {"run": str(run.pk), "name": "metrics", "state": "running"}
    assert _value(samples, "switchyard_training_run_tokens", **run_labels) == learner.tokens
    assert _value(samples, "switchyard_training_run_cost", **run_labels, currency="USD") > 0
    run.refresh_from_db()
    assert _value(samples, "switchyard_training_run_eval_loss", **run_labels) == pytest.approx(
        run.initial_eval_loss
    )


def test_a_failed_request_and_an_open_circuit_show_in_the_series(
    admin_user: User, providers: tuple[MockProviderServer, MockProviderServer], settings: Any
) -> None:
    failing, _ = providers
    settings.INFERENCE_BREAKER_MIN_REQUESTS = 2
    settings.INFERENCE_MAX_ROUNDS = 1
    primary = priced_deployment(failing)
    workflow = routed_workflow(admin_user, [primary])
    for _ in range(3):
        assert not route(workflow=workflow, request=PING).ok
    samples = _scrape()
    failed = _value(
        samples, "switchyard_gateway_requests_total", workflow=workflow.slug, deployment="", status="failed"
    )
    assert failed == 3
    assert _value(samples, "switchyard_breaker_state", deployment=primary.slug) == 2  # open
    skipped = _value(
        samples,
        "switchyard_gateway_attempts_total",
        workflow=workflow.slug,
        deployment=primary.slug,
        outcome="circuit_open",
    )
    assert skipped >= 1


def test_with_metrics_off_the_router_counts_nothing(
    admin_user: User, providers: tuple[MockProviderServer, MockProviderServer], settings: Any
) -> None:
    _, healthy = providers
    settings.METRICS_ENABLED = False
    workflow = routed_workflow(admin_user, [priced_deployment(healthy)])
    assert route(workflow=workflow, request=PING).ok
    samples = _scrape()
    assert not [
        labels
        for labels, _ in samples.get("switchyard_gateway_requests_total", [])
        if labels["workflow"] == workflow.slug
    ]


def test_by_default_nobody_scrapes_without_the_token_not_even_loopback(settings: Any) -> None:
    assert settings.METRICS_TOKEN == "" and settings.METRICS_ALLOW_NETWORKS == []
    assert settings.METRICS_ALLOW_LOOPBACK is False
    for address in ("10.1.2.3", "::1", "127.0.0.1"):  # a proxy on the same host reads as loopback
        refused = Client(REMOTE_ADDR=address).get("/metrics")
        assert refused.status_code == 403 and b"SWITCHYARD_METRICS_TOKEN" in refused.content
        assert b"switchyard_" not in refused.content
    settings.METRICS_TOKEN = TOKEN
    assert Client().get("/metrics").status_code == 401  # the test client is 127.0.0.1


def test_loopback_scrapes_without_the_token_only_when_allowed_explicitly(settings: Any) -> None:
    settings.METRICS_ALLOW_LOOPBACK = True
    assert Client(REMOTE_ADDR="::1").get("/metrics").status_code == 200
    assert Client().get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 403
    settings.METRICS_TOKEN = TOKEN
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 401
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 200


def test_no_label_carries_an_api_keys_name_or_prefix(admin_user: User) -> None:
    token, _ = api_token_create(user=admin_user, name="payroll-bot-secret-name")
    budget = Budget.objects.create(
        name=f"key {token.prefix} ({token.name})",  # how stack.keys names a key's budget
        scope=Budget.Scope.API_KEY,
        api_key=token,
        limit_amount=Decimal("5"),
    )
    response = Client(HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    with override_settings(METRICS_TOKEN=TOKEN):
        text = response.get("/metrics").content.decode()
    assert token.name not in text and token.prefix not in text
    samples = _scrape()
    labels = {"budget": f"budget-{budget.pk}", "scope": "api_key", "target": str(token.pk)}
    assert _value(samples, "switchyard_budget_limit", **labels) == 5.0


def test_with_a_token_a_scrape_must_present_it(settings: Any) -> None:
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOW_NETWORKS = []  # any address, with the token
    missing = Client(REMOTE_ADDR="10.1.2.3").get("/metrics")
    assert missing.status_code == 401 and missing["WWW-Authenticate"] == 'Bearer realm="metrics"'
    wrong = Client(REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION=f"Bearer {TOKEN}x").get("/metrics")
    assert wrong.status_code == 401
    assert b"switchyard" not in missing.content + wrong.content
    right = Client(REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert "switchyard_queue_depth" in _scrape(right)
    assert right.post("/metrics").status_code == 405


def test_a_token_and_networks_are_both_required_when_both_are_set(settings: Any) -> None:
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOW_NETWORKS = ["10.0.0.0/8"]
    auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    assert Client(REMOTE_ADDR="192.168.1.1", **auth).get("/metrics").status_code == 403
    assert Client(REMOTE_ADDR="10.9.9.9").get("/metrics").status_code == 401
    assert Client(REMOTE_ADDR="10.9.9.9", **auth).get("/metrics").status_code == 200


def test_behind_trusted_proxies_the_forwarded_client_address_is_checked(settings: Any) -> None:
    settings.SWITCHYARD_TRUSTED_PROXIES = 1
    settings.METRICS_ALLOW_NETWORKS = ["10.0.0.0/8"]
    settings.METRICS_TOKEN = TOKEN
    proxy = {"REMOTE_ADDR": "127.0.0.1", "HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
    assert Client(**proxy, HTTP_X_FORWARDED_FOR="10.2.3.4").get("/metrics").status_code == 200
    assert Client(**proxy, HTTP_X_FORWARDED_FOR="10.2.3.4, 8.8.8.8").get("/metrics").status_code == 403


def test_a_streamed_request_is_counted_once_when_its_stream_ends(
    admin_user: User, providers: tuple[MockProviderServer, MockProviderServer]
) -> None:
    _, healthy = providers
    deployment = priced_deployment(healthy)
    workflow = routed_workflow(admin_user, [deployment])
    stream = route_stream(workflow=workflow, request=PING)
    before = _scrape().get("switchyard_gateway_requests_total", [])
    assert not [labels for labels, _ in before if labels["workflow"] == workflow.slug]  # not ended yet
    assert "".join(chunk.text for chunk in stream)
    samples = _scrape()
    labels = {"workflow": workflow.slug, "deployment": deployment.slug}
    assert _value(samples, "switchyard_gateway_requests_total", **labels, status="succeeded") == 1
    assert _value(samples, "switchyard_gateway_attempts_total", **labels, outcome="ok") == 1
