"""`bench gateway`'s stage profile counts the round trips a /v1 call really makes and splits the
request thread's CPU by stage; its target ratios read the run's own direct figures."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from bench.gateway.profile import OTHER, STAGES, _stage, stage_profile
from bench.gateway.targets import RATIO_TARGETS, target_ratios
from bench.mockprovider import MockProviderServer
from registry.auth.roles import Role
from registry.models import Workflow
from registry.services import api_token_create
from tests.factories import make_deployment, make_user, make_workflow

pytestmark = pytest.mark.django_db(transaction=True)


def _workflow_token(*urls: str) -> tuple[str, str]:
    user = make_user(Role.VIEWER)
    workflow = make_workflow(owner=user, deployments=[make_deployment(base_url=url) for url in urls])
    _, raw = api_token_create(user=user, name="profile")
    return raw, workflow.slug


def test_the_profile_counts_one_upstream_exchange_per_answered_call(
    mock_provider: Callable[..., MockProviderServer],
) -> None:
    token, slug = _workflow_token(mock_provider().base_url)
    figures = stage_profile(token=token, model=slug, n=6, warmup=1, conn_max_age=0)
    trips = figures["round_trips_per_request"]
    assert trips["http"] == 1.0
    assert trips["sql"] >= 1  # at least the request's own row
    stages = figures["stage_cpu_us_estimated"]
    assert "call: router, adapter, retries" in stages and "journal: the durable row" in stages
    # The stages share out the unprofiled request's CPU (up to rounding).
    assert sum(stages.values()) == pytest.approx(figures["request_thread_cpu_p50_us"], rel=0.01)


def test_a_failover_shows_as_a_second_upstream_exchange(
    mock_provider: Callable[..., MockProviderServer],
) -> None:
    failing, answering = mock_provider(status=503), mock_provider()
    token, slug = _workflow_token(failing.base_url, answering.base_url)
    figures = stage_profile(token=token, model=slug, n=3, warmup=0, conn_max_age=0)
    assert figures["round_trips_per_request"]["http"] == 2.0
    # Three passes (plain, cProfile, stage clock) of three calls, all answered by the fallback;
    # the plain pass's calls each tried the failing primary first (later passes may find its
    # circuit open).
    assert failing.behaviour.total_calls() >= 3 and answering.behaviour.total_calls() == 9


def test_stages_are_matched_by_module_first_match_wins() -> None:
    assert _stage("/app/inference/router/policy.py", "plan") == STAGES[4][0]
    assert _stage("/app/inference/router/calls.py", "call") == STAGES[5][0]
    assert _stage("/venv/site-packages/django/http/request.py", "body") == "Django (handler, request, ORM)"
    assert (
        _stage("~", "<method 'recv_into' of '_socket.socket' objects>") == "HTTP client and sockets (stdlib)"
    )
    assert _stage("/usr/lib/python3.11/enum.py", "__call__") == OTHER


def test_the_targets_are_ratios_to_the_same_runs_direct_call() -> None:
    out: dict[str, Any] = {figure: 1.0 for figure in RATIO_TARGETS}
    out.update(
        direct_p50_ms=0.5,
        gateway_overhead_p50_ms=1.6,  # 3.2x: over the 3x bound
        gateway_rps_16=300.0,
        direct_rps_16=500.0,
        gateway_rps_16_errors=0,
        gateway_cpu_ms_per_request=2.5,
    )
    ratios = target_ratios(out)
    assert ratios["gateway_overhead_to_direct"] == 3.2
    assert ratios["failover_overhead_to_direct"] == 2.0
    assert ratios["gateway_rps_16_to_direct"] == 0.6
    met = ratios["targets_met"]
    assert met["gateway_overhead_to_direct"] is False and met["failover_overhead_to_direct"] is True
    assert met["limits_and_budgets_added_to_direct"] is False  # 2.0 against 0.5
    assert met["gateway_rps_16_to_direct"] is True and met["gateway_cpu_ms_per_request"] is False


@pytest.mark.parametrize("limited", [False, True], ids=["no-limits", "rate-limited"])
def test_a_call_reads_its_grant_version_limits_generation_and_breakers_in_one_redis_round_trip(
    mock_provider: Callable[..., MockProviderServer], limited: bool
) -> None:
    """The rate limits' script call also reads the route's breakers and the route-cache
    generation (inference.router.calls.route_peek_ask), so the router peeks no more."""
    token, slug = _workflow_token(mock_provider().base_url)
    if limited:
        Workflow.objects.filter(slug=slug).update(rpm_limit=10_000, tpm_limit=10_000_000)
    figures = stage_profile(token=token, model=slug, n=4, warmup=1, conn_max_age=0)
    assert figures["round_trips_per_request"]["redis"] == 1.0
    assert figures["round_trips_per_request"]["http"] == 1.0
