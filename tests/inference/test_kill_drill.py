"""The kill drill: a web worker is SIGKILLed mid-traffic and the ledger still holds every answer.

gunicorn runs the production configuration (stack/gunicorn_conf.py, 2 workers) against the test
database; 8 clients using the official openai SDK (no retries) send 2,000 requests through it to
a loopback provider, and half-way through one worker is killed as a crash would kill it
(gunicorn starts another). Afterwards every request a client saw answered has exactly one
succeeded InferenceRequest row with its input and output UsageRecord rows; nothing is recorded
twice; no request is half-recorded (a request without its usage rows, usage rows without their
request), answered or not; and `ledger verify` passes.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from decimal import Decimal
from io import StringIO
from pathlib import Path
from typing import Any

import openai
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from bench.mockprovider import MockProviderServer
from billing.models import Unit, UsageRecord
from inference.models import InferenceAttempt, InferenceRequest
from registry.models import Workflow
from registry.services import api_token_create
from tests.inference.helpers import priced_deployment, routed_workflow
from tests.integration.gunicorn_server import Gateway, gateway_running
from tests.integration.processes import session_database_url, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CLIENTS = 8
TOTAL = 2000
WORKERS = 2


@pytest.fixture
def gateway(transactional_db: Any, tmp_path: Path) -> Iterator[Gateway]:
    with gateway_running(
        tmp_path / "gunicorn.log", database_url=session_database_url(), workers=WORKERS
    ) as server:
        yield server


def _wait_until_recorded(*, workflow: Workflow, request_ids: set[int]) -> None:
    """Return once the surviving workers' folder threads have folded every journal entry of the
    workflow into the ledger (the killed worker's included: a live folder takes any pending
    entry). No fold is done here: the server's own folders must do it."""
    pending = InferenceRequest.objects.filter(workflow=workflow, ledger_pending__isnull=False)
    wait_until(lambda: not pending.exists(), timeout=120, what="the journal to be folded")
    assert request_ids <= set(InferenceRequest.objects.filter(workflow=workflow).values_list("pk", flat=True))


def test_a_worker_killed_mid_traffic_leaves_every_answered_request_recorded_once(
    gateway: Gateway, viewer: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    provider = mock_provider(tokens_in=7, tokens_out=3)  # answers at once
    workflow = routed_workflow(viewer, [priced_deployment(provider)])
    _, raw_token = api_token_create(user=viewer, name="kill-drill")

    lock = threading.Lock()
    next_index = 0
    answered: list[tuple[int, str]] = []  # (x-switchyard-request-id, the completion's id)
    errors: list[BaseException] = []
    killed: list[int] = []
    answered_at_kill: list[int] = []

    def kill_one_worker() -> None:
        victim = gateway.workers()[0]
        os.kill(victim, signal.SIGKILL)  # as a crash would: no shutdown handler runs
        killed.append(victim)
        answered_at_kill.append(len(answered))

    def client_loop() -> None:
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=raw_token, max_retries=0, timeout=60)
        with client:
            while (index := take_index()) < TOTAL:
                send(client, index)

    def take_index() -> int:
        nonlocal next_index
        with lock:
            index, next_index = next_index, next_index + 1
            if index == TOTAL // 2:
                kill_one_worker()  # the other clients' requests are in flight
            return index

    def send(client: openai.OpenAI, index: int) -> None:
        try:
            reply = client.chat.completions.with_raw_response.create(
                model=workflow.slug, messages=[{"role": "user", "content": f"request {index}"}]
            )
            completion = reply.parse()
            with lock:
                answered.append((int(reply.headers["x-switchyard-request-id"]), completion.id))
        except BaseException as exc:  # noqa: BLE001 (collected and asserted below)
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=client_loop) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    # The drill happened: one worker died mid-traffic, gunicorn replaced it and kept answering.
    assert len(killed) == 1
    assert answered_at_kill[0] < len(answered)
    wait_until(
        lambda: len(gateway.workers()) == WORKERS and killed[0] not in gateway.workers(),
        timeout=60,
        what="gunicorn to replace the killed worker",
    )
    # Only the killed worker's connections failed, as dropped connections (never an HTTP error).
    assert all(isinstance(e, openai.APIConnectionError) for e in errors), errors[:3]
    assert len(answered) + len(errors) == TOTAL

    request_ids = {request_id for request_id, _ in answered}
    assert len(request_ids) == len(answered)  # no two answers share a request
    assert len({completion_id for _, completion_id in answered}) == len(answered)

    _wait_until_recorded(workflow=workflow, request_ids=request_ids)

    requests = InferenceRequest.objects.filter(workflow=workflow)
    # Every answered request has its row, succeeded; the errored ones may have one too.
    assert requests.filter(pk__in=request_ids, status=InferenceRequest.Status.SUCCEEDED).count() == len(
        request_ids
    )
    assert request_ids <= set(requests.values_list("pk", flat=True))
    assert requests.count() <= TOTAL

    usage = UsageRecord.objects.filter(workflow=workflow)
    keys = list(usage.values_list("idempotency_key", flat=True))
    assert len(keys) == len(set(keys))
    units: dict[str, Counter[str]] = defaultdict(Counter)
    for subject_type, subject_id, unit in usage.values_list("subject_type", "subject_id", "unit"):
        assert subject_type == "inference_request"
        units[subject_id][unit] += 1
    statuses = dict(requests.values_list("pk", "status"))
    # No usage without its request; every succeeded request billed once for input and output;
    # a failed one (none expected) billed nothing.
    assert set(units) <= {str(pk) for pk in statuses}
    expected = Counter({Unit.INPUT_TOKENS_1M.value: 1, Unit.OUTPUT_TOKENS_1M.value: 1})
    for pk, status in statuses.items():
        billed = units.get(str(pk), Counter())
        assert billed == (expected if status == InferenceRequest.Status.SUCCEEDED else Counter()), (
            pk,
            status,
        )
    assert set(requests.filter(pk__in=request_ids).values_list("tokens_in", "tokens_out")) == {(7, 3)}
    # The fold wrote each answered request's attempt too, and the request costs add up to the ledger.
    assert InferenceAttempt.objects.filter(request_id__in=request_ids, outcome="ok").count() == len(
        request_ids
    )
    assert sum(requests.values_list("cost", flat=True), Decimal(0)) == sum(
        usage.values_list("amount", flat=True), Decimal(0)
    )

    out = StringIO()
    call_command("ledger", "verify", stdout=out)  # raises CommandError on a broken chain
    assert "chain intact" in out.getvalue()
