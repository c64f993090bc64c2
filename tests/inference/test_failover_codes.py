"""Failover events carry a code of the shared taxonomy, set from the real cause of each failed
call, and circuit transitions are events of their own (recorded with the request that caused
them, through the journal when it is on)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User

from bench.mockprovider import MockProviderServer
from inference.adapters.base import ChatMessage, ChatRequest, ProviderError, Target
from inference.adapters.openai_compat import OpenAICompatibleAdapter
from inference.breaker.breakers import breaker_state
from inference.recording import journal_fold_all
from inference.recording.fold import breaker_transition_record
from inference.router.entry import route
from registry.failover_codes import FailoverCode
from registry.models import FailoverEvent
from tests.factories import make_user
from tests.inference.helpers import priced_deployment, routed_workflow

PING = ChatRequest(messages=(ChatMessage("user", "ping"),))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("behaviour", "code"),
    [
        ({"status": 503}, FailoverCode.HTTP_5XX),
        ({"status": 500}, FailoverCode.HTTP_5XX),
        ({"status": 429}, FailoverCode.HTTP_429),
        ({"status": 404}, FailoverCode.HTTP_4XX),
        ({"malformed": True}, FailoverCode.MALFORMED_RESPONSE),
    ],
)
def test_a_failed_call_that_fails_over_is_coded_from_what_the_provider_did(
    admin_user: User,
    mock_provider: Callable[..., MockProviderServer],
    behaviour: dict[str, Any],
    code: FailoverCode,
) -> None:
    failing, healthy = mock_provider(**behaviour), mock_provider()
    primary, fallback = priced_deployment(failing), priced_deployment(healthy)
    result = route(workflow=routed_workflow(admin_user, [primary, fallback]), request=PING)
    assert result.ok and result.deployment_slug == fallback.slug
    event = FailoverEvent.objects.get()
    assert (event.code, event.from_deployment_id, event.to_deployment_id) == (code, primary.pk, fallback.pk)


@pytest.mark.django_db
def test_a_provider_nobody_listens_on_is_a_connection_error(
    admin_user: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    dead = priced_deployment(base_url=f"http://127.0.0.1:{_closed_port()}/v1")
    healthy = priced_deployment(mock_provider())
    assert route(workflow=routed_workflow(admin_user, [dead, healthy]), request=PING).ok
    assert FailoverEvent.objects.get().code == FailoverCode.CONNECTION_ERROR


def test_a_provider_slower_than_the_call_timeout_is_a_timeout(
    mock_provider: Callable[..., MockProviderServer],
) -> None:
    slow = mock_provider(delay_ms=500)
    target = Target(
        deployment_id=1, slug="slow", kind="openai-compatible", base_url=slow.base_url,
        provider_model_id="m", allow_private=True,
    )  # fmt: skip
    with pytest.raises(ProviderError) as raised:
        OpenAICompatibleAdapter().complete(target, PING, timeout=0.05)
    assert raised.value.code == FailoverCode.TIMEOUT and raised.value.retryable


def test_a_status_alone_decides_the_code_when_the_adapter_names_none() -> None:
    codes = [ProviderError("x", retryable=True, status_code=s).code for s in (429, 408, 502, 403, None)]
    assert codes == ["http_429", "timeout", "http_5xx", "http_4xx", "other"]


def _breaker_events() -> list[tuple[str, int | None]]:
    rows = FailoverEvent.objects.filter(code__in=[FailoverCode.CIRCUIT_OPEN, FailoverCode.CIRCUIT_CLOSED])
    return list(rows.order_by("detected_at", "id").values_list("code", "from_deployment_id"))


@pytest.fixture
def fast_breakers(settings: Any) -> None:
    settings.INFERENCE_BREAKER_MIN_REQUESTS = 3
    settings.INFERENCE_BREAKER_FAILURE_RATE = 0.5
    settings.INFERENCE_BREAKER_COOLDOWN_SECONDS = 0.3


@pytest.mark.django_db
def test_a_circuit_opening_and_closing_each_record_exactly_one_event(
    admin_user: User, mock_provider: Callable[..., MockProviderServer], fast_breakers: None
) -> None:
    flaky, healthy = mock_provider(status=503), mock_provider()
    primary, fallback = priced_deployment(flaky), priced_deployment(healthy)
    workflow = routed_workflow(admin_user, [primary, fallback])
    for _ in range(5):  # three failures open it; two more requests skip it while it is open
        assert route(workflow=workflow, request=PING).ok
    assert breaker_state(primary.pk) == "open"
    assert _breaker_events() == [(FailoverCode.CIRCUIT_OPEN, primary.pk)]
    opened = FailoverEvent.objects.get(code=FailoverCode.CIRCUIT_OPEN)
    assert opened.details["cause"] == FailoverCode.HTTP_5XX and opened.subject == f"deployment:{primary.slug}"
    flaky.behaviour.status = 200
    time.sleep(0.35)
    assert route(workflow=workflow, request=PING).deployment_slug == primary.slug
    assert breaker_state(primary.pk) == "closed"
    assert _breaker_events() == [
        (FailoverCode.CIRCUIT_OPEN, primary.pk),
        (FailoverCode.CIRCUIT_CLOSED, primary.pk),
    ]
    # Three calls failed over before the circuit opened: each one is an http_5xx event.
    assert FailoverEvent.objects.filter(code=FailoverCode.HTTP_5XX).count() == 3


@pytest.fixture
def journal(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Journal mode with the folder thread held back: the test folds when it chooses."""
    settings.INFERENCE_RECORDING = "journal"
    monkeypatch.setattr("inference.recording.record.journal_nudge", lambda: None)
    yield


@pytest.mark.django_db(transaction=True)
def test_with_the_journal_a_transition_is_written_by_the_fold_not_by_the_request(
    journal: None, mock_provider: Callable[..., MockProviderServer], fast_breakers: None
) -> None:
    owner = make_user(username="breaker-journal")
    flaky, healthy = mock_provider(status=503), mock_provider()
    primary, fallback = priced_deployment(flaky), priced_deployment(healthy)
    workflow = routed_workflow(owner, [primary, fallback])
    for _ in range(3):
        assert route(workflow=workflow, request=PING).ok
    assert breaker_state(primary.pk) == "open"
    assert not FailoverEvent.objects.exists()  # nothing written on the requests' path
    assert journal_fold_all() == 3
    assert _breaker_events() == [(FailoverCode.CIRCUIT_OPEN, primary.pk)]
    assert journal_fold_all() == 0 and len(_breaker_events()) == 1  # folded once


@pytest.mark.django_db
def test_a_transition_no_request_carries_is_recorded_by_the_recorder_thread_path(
    mock_provider: Callable[..., MockProviderServer],
) -> None:
    deployment = priced_deployment(mock_provider())
    breaker_transition_record(deployment_id=deployment.pk, transition="closed", cause="")
    event = FailoverEvent.objects.get()
    assert (event.code, event.from_deployment_id, event.kind) == (
        "circuit_closed",
        deployment.pk,
        "inference",
    )
