"""`/metrics`: Switchyard in the Prometheus text format.

Two kinds of series:

- counted on the request path, in the process that routes (inference.metrics): gateway
  requests, attempts, latency histograms and tokens. Under gunicorn every worker writes its
  values to prometheus-client's multiprocess files (PROMETHEUS_MULTIPROC_DIR, set up by
  stack/gunicorn_conf.py) and a scrape of any worker sums them all;
- read at scrape time from the database and Redis (`StackCollector`): spend today and this month
  per provider, workflow and team (the ledger's daily rollups), budgets' limit, spend and what
  remains (their current period rows), breaker state per deployment, failover events per kind and code,
  Celery queue depth per queue, each cluster's heartbeat age and status, and live training
  runs' tokens, eval loss and cost. These reads are shared across scrapes for
  SWITCHYARD_METRICS_CACHE_SECONDS, so several Prometheus servers cost one read per period.

Who may scrape (SWITCHYARD_METRICS_TOKEN, SWITCHYARD_METRICS_ALLOW_NETWORKS,
SWITCHYARD_METRICS_ALLOW_LOOPBACK): a request must come from an allowed network when networks are
set, and present `Authorization: Bearer <token>` (compared in constant time). Without a token
/metrics answers nobody, unless SWITCHYARD_METRICS_ALLOW_LOOPBACK=1 lets loopback in without one.
The token is the platform's, not a team's: the series name every team (spend per team, budgets
with their team and workflow slugs), so whoever holds it reads all teams' spend. No label carries
an API key's name or prefix: a key's budget is `budget-<id>` with the key's id as its target.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import date, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_safe
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from billing.budgets.state import budgets_standing
from billing.models import Budget
from billing.selectors import spend_grouped
from inference.breaker.breakers import breakers
from inference.breaker.state import CLOSED, HALF_OPEN, OPEN
from registry.models import Cluster
from registry.queues import CONTROL_QUEUE
from registry.selectors import deployments_enabled, failover_event_counts
from registry.shared_redis.client import REDIS_DOWN_ERRORS, redis_client
from stack.login_throttle import client_ip
from training.selectors import runs_for_metrics

logger = logging.getLogger(__name__)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BREAKER_VALUES = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}
# Finished training runs stay on /metrics this long, so their final figures are scraped.
FINISHED_RUNS_SECONDS = 3600
# Kombu's Redis transport keeps a queue's messages of priority p > 0 in "<queue>\x06\x16<p>"
# (its default priority steps 0, 3, 6, 9).
_PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")


def _money(value: Decimal) -> float:
    # The exposition format has only floats; the ledger keeps the exact amounts.
    return float(value)


def _spend(families: list[Metric], today: date) -> None:
    month_start = today.replace(day=1)
    by = ("day", "provider__slug", "workflow__slug", "team", "currency")
    labels = ["provider", "workflow", "team", "currency"]
    day_family = GaugeMetricFamily(
        "switchyard_spend_today", "Spend so far today (UTC), from the ledger's daily rollups.", labels=labels
    )
    month_family = GaugeMetricFamily(
        "switchyard_spend_month_to_date",
        "Spend so far this calendar month (UTC), from the ledger's daily rollups.",
        labels=labels,
    )
    month: dict[tuple[str, ...], Decimal] = {}
    day: dict[tuple[str, ...], Decimal] = {}
    for (row_day, provider, workflow, team, currency), total in spend_grouped(
        by=by, since_day=month_start
    ).items():
        key: tuple[str, ...] = (provider or "", workflow or "", team or "", currency)
        month[key] = month.get(key, Decimal(0)) + total
        if row_day == today:
            day[key] = day.get(key, Decimal(0)) + total
    for values, total in sorted(month.items()):
        month_family.add_metric(list(values), _money(total))
    for values, total in sorted(day.items()):
        day_family.add_metric(list(values), _money(total))
    families += [day_family, month_family]


def _budgets(families: list[Metric], now: datetime) -> None:
    labels = ["budget", "scope", "target", "currency"]
    limit = GaugeMetricFamily(
        "switchyard_budget_limit", "A budget's limit for its current period.", labels=labels
    )
    spent = GaugeMetricFamily(
        "switchyard_budget_spent", "Spend recorded in a budget's current period.", labels=labels
    )
    remaining = GaugeMetricFamily(
        "switchyard_budget_remaining",
        "What a budget's current period has left: limit minus spent minus held reservations.",
        labels=labels,
    )
    for standing in budgets_standing(now=now):
        budget = standing.budget
        values = [*_budget_labels(budget), budget.currency]
        limit.add_metric(values, _money(budget.limit_amount))
        spent.add_metric(values, _money(standing.spent))
        remaining.add_metric(values, _money(standing.remaining))
    families += [limit, spent, remaining]


def _budget_labels(budget: Budget) -> tuple[str, str, str]:
    """(budget, scope, target). An API key's budget is named by ids only: its name and target
    would carry the key's name and prefix (stack.keys names a key's budget after them)."""
    if budget.scope == Budget.Scope.API_KEY:
        return f"budget-{budget.pk}", budget.scope, str(budget.api_key_id or "")
    target = getattr(budget, budget.SCOPE_FIELDS[budget.scope])
    return budget.name, budget.scope, str(getattr(target, "slug", target) or "")


def _breakers(families: list[Metric]) -> None:
    family = GaugeMetricFamily(
        "switchyard_breaker_state",
        "Circuit breaker per deployment: 0 closed, 1 half-open, 2 open.",
        labels=["deployment"],
    )
    deployments = list(deployments_enabled().values_list("pk", "slug"))
    states = breakers().states([pk for pk, _ in deployments]) if deployments else {}
    for pk, slug in deployments:
        if pk in states:
            family.add_metric([slug], BREAKER_VALUES.get(states[pk], 0))
    families.append(family)


def _failovers(families: list[Metric]) -> None:
    total = CounterMetricFamily(
        "switchyard_failover_events", "Failover events recorded, per kind and code.", labels=["kind", "code"]
    )
    still_open = GaugeMetricFamily(
        "switchyard_failover_events_open",
        "Failover events not recovered yet, per kind and code.",
        labels=["kind", "code"],
    )
    for (kind, code), (events, open_events) in sorted(failover_event_counts().items()):
        total.add_metric([kind, code], events)
        still_open.add_metric([kind, code], open_events)
    families += [total, still_open]


def _queue_depths(families: list[Metric], clusters: list[Cluster]) -> None:
    """LLEN of each Celery queue on a Redis broker; the embedded filesystem broker has none."""
    broker = str(settings.CELERY_BROKER_URL)
    if not broker.startswith(("redis://", "rediss://")):
        return
    queues = [CONTROL_QUEUE, *(c.queue for c in clusters)]
    pipe = redis_client(broker, timeout=1.0).pipeline(transaction=False)
    for name in queues:
        for suffix in _PRIORITY_SUFFIXES:
            pipe.llen(name + suffix)
    try:
        lengths = pipe.execute()
    except REDIS_DOWN_ERRORS:
        logger.warning("metrics: the broker did not answer; no queue depths in this scrape")
        return
    family = GaugeMetricFamily(
        "switchyard_queue_depth", "Messages waiting in a Celery queue (Redis broker).", labels=["queue"]
    )
    step = len(_PRIORITY_SUFFIXES)
    for i, name in enumerate(queues):
        family.add_metric([name], sum(lengths[i * step : (i + 1) * step]))
    families.append(family)


def _clusters(families: list[Metric], clusters: list[Cluster], now: datetime) -> None:
    age = GaugeMetricFamily(
        "switchyard_cluster_heartbeat_age_seconds",
        "Seconds since a cluster's workers last sent a heartbeat.",
        labels=["cluster"],
    )
    status = GaugeMetricFamily(
        "switchyard_cluster_status",
        "A cluster's health (1 for its current status).",
        labels=["cluster", "status"],
    )
    for cluster in clusters:
        if cluster.last_heartbeat_at is not None:
            age.add_metric([cluster.slug], max(0.0, (now - cluster.last_heartbeat_at).total_seconds()))
        status.add_metric([cluster.slug, cluster.status], 1)
    families += [age, status]


def _training(families: list[Metric], now: datetime) -> None:
    labels = ["run", "name", "state"]
    tokens = GaugeMetricFamily(
        "switchyard_training_run_tokens", "Tokens a training run's learners have trained.", labels=labels
    )
    loss = GaugeMetricFamily(
        "switchyard_training_run_eval_loss",
        "Eval loss of a training run's newest global parameters.",
        labels=labels,
    )
    cost = GaugeMetricFamily(
        "switchyard_training_run_cost",
        "A training run's cost so far (the ledger's rollups).",
        labels=[*labels, "currency"],
    )
    since = now - timedelta(seconds=FINISHED_RUNS_SECONDS)
    for run in runs_for_metrics(finished_since=since):
        values = [str(run.run_id), run.name, run.state]
        tokens.add_metric(values, run.tokens)
        if run.eval_loss is not None:
            loss.add_metric(values, run.eval_loss)
        cost.add_metric([*values, run.currency], _money(run.cost))
    families += [tokens, loss, cost]


def stack_families() -> list[Metric]:
    """Every series read at scrape time (uncached)."""
    now = timezone.now()
    families: list[Metric] = []
    clusters = list(Cluster.objects.order_by("slug"))
    _spend(families, now.date())
    _budgets(families, now)
    _breakers(families)
    _failovers(families)
    _queue_depths(families, clusters)
    _clusters(families, clusters, now)
    _training(families, now)
    return families


class StackCollector(Collector):
    """The scrape-time series, shared across scrapes for METRICS_CACHE_SECONDS."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: list[Metric] = []
        self._read_at = float("-inf")

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            if time.monotonic() - self._read_at >= settings.METRICS_CACHE_SECONDS:
                self._families = stack_families()
                self._read_at = time.monotonic()
            return list(self._families)

    def clear(self) -> None:
        with self._lock:
            self._read_at = float("-inf")


class _Forward(Collector):
    """The process's own registry (outside gunicorn: the router's series and process_* ones)."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        # Every gunicorn worker's values, the dead ones' counters and histograms included.
        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_Forward())
    registry.register(stack_collector)
    return registry


stack_collector = StackCollector()
_scrape_registry: CollectorRegistry | None = None


def _refusal(request: HttpRequest) -> HttpResponse | None:
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(
            client_ip(request)
        )
    except ValueError:
        address = None
    networks = settings.METRICS_ALLOW_NETWORKS
    if networks and (address is None or not any(address in ipaddress.ip_network(n) for n in networks)):
        return HttpResponse("forbidden\n", status=403, content_type="text/plain")
    token = settings.METRICS_TOKEN
    header = str(request.META.get("HTTP_AUTHORIZATION", ""))
    scheme, _, presented = header.partition(" ")
    if (
        token
        and scheme.lower() == "bearer"
        and hmac.compare_digest(presented.strip().encode(), token.encode())
    ):
        return None
    # Loopback without the token only when asked for: behind a proxy on the same host that is
    # not declared (SWITCHYARD_TRUSTED_PROXIES) every client reads as loopback.
    if settings.METRICS_ALLOW_LOOPBACK and address is not None and address.is_loopback:
        return None
    if not token:
        return HttpResponse(
            "forbidden: set SWITCHYARD_METRICS_TOKEN to scrape /metrics\n",
            status=403,
            content_type="text/plain",
        )
    response = HttpResponse("unauthorized\n", status=401, content_type="text/plain")
    response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


@require_safe  # GET and HEAD
def metrics_view(request: HttpRequest) -> HttpResponse:
    global _scrape_registry
    refused = _refusal(request)
    if refused is not None:
        return refused
    if _scrape_registry is None:
        _scrape_registry = _registry()
    return HttpResponse(generate_latest(_scrape_registry), content_type=CONTENT_TYPE)
