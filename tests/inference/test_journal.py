"""The request journal: an answered request is durable as one row before the answer, and its
attempts, ledger rows and failover events are folded in exactly once (inference.recording)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from bench.mockprovider import MockProviderServer
from billing.budgets import BudgetExhausted
from billing.models import Budget, BudgetPeriod, PriceBook, UsageRecord
from billing.selectors import ledger_verify
from inference import tasks
from inference.adapters.base import ChatMessage, ChatRequest
from inference.models import InferenceAttempt, InferenceRequest
from inference.recording import journal_fold, journal_fold_all, journal_status
from inference.router.entry import route
from registry.models import FailoverEvent, Workflow
from tests.factories import make_user
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db(transaction=True)
PING = ChatRequest(messages=(ChatMessage("user", "ping"),))
Outcome = InferenceAttempt.Outcome


@pytest.fixture
def journal(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Journal mode with the folder thread held back: the test folds when it chooses.
    Yields the list of nudges (one per journaled request)."""
    settings.INFERENCE_RECORDING = "journal"
    nudges: list[int] = []
    monkeypatch.setattr("inference.recording.record.journal_nudge", lambda: nudges.append(1))
    yield nudges


@pytest.fixture
def owner() -> User:
    return make_user(username="journal-owner")


def _cap(workflow: Workflow, limit: Decimal) -> Budget:
    """The workflow's hard budget "cap" of `limit` USD."""
    return Budget.objects.create(
        name="cap", scope=Budget.Scope.WORKFLOW, workflow=workflow, limit_amount=limit, hard_limit=True
    )


def _ledger_rows(request_id: int) -> list[tuple[str, Decimal]]:
    rows = UsageRecord.objects.filter(subject_type="inference_request", subject_id=str(request_id))
    return sorted(rows.values_list("unit", "amount"))


def test_an_answered_request_is_one_row_with_its_journal_until_folded(
    journal: list[int], owner: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    server = mock_provider(tokens_in=1000, tokens_out=500)
    workflow = routed_workflow(owner, [priced_deployment(server)])
    result = route(workflow=workflow, request=PING)
    assert result.ok and result.cost == Decimal("0.002500000") and journal == [1]
    row = InferenceRequest.objects.get(pk=result.request_id)
    # Durable before the answer: the request row (with its predicted cost) and its journal entry.
    assert row.status == "succeeded" and row.cost == Decimal("0.002500000")
    assert row.ledger_pending is not None and row.ledger_pending["billed"]
    assert _ledger_rows(row.pk) == [] and not InferenceAttempt.objects.filter(request=row).exists()
    assert journal_status()["pending"] == 1

    assert journal_fold() == 1
    row.refresh_from_db()
    assert row.ledger_pending is None and row.cost == Decimal("0.002500000")
    assert _ledger_rows(row.pk) == [
        ("input_tokens_1m", Decimal("0.001000000")),
        ("output_tokens_1m", Decimal("0.001500000")),
    ]
    attempt = InferenceAttempt.objects.get(request=row)
    assert (attempt.outcome, attempt.tokens_in, attempt.cost) == (Outcome.OK, 1000, Decimal("0.002500000"))
    assert journal_fold() == 0  # nothing left: folding again writes nothing
    assert UsageRecord.objects.count() == 2
    assert all(ledger_verify(partition=p).ok for p in UsageRecord.objects.values_list("partition", flat=True))


def test_failover_events_and_attempts_come_from_the_journal(
    journal: list[int], owner: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    failing, healthy = mock_provider(status=503), mock_provider()
    primary, fallback = priced_deployment(failing), priced_deployment(healthy)
    workflow = routed_workflow(owner, [primary, fallback])
    result = route(workflow=workflow, request=PING)
    assert result.ok and FailoverEvent.objects.count() == 0
    journal_fold_all()
    attempts = list(
        InferenceAttempt.objects.filter(request_id=result.request_id).values_list(
            "deployment_id", "outcome", "status_code"
        )
    )
    assert attempts == [(primary.pk, Outcome.RETRYABLE, 503), (fallback.pk, Outcome.OK, 200)]
    event = FailoverEvent.objects.get()
    assert (event.from_deployment_id, event.to_deployment_id, event.status_code) == (
        primary.pk,
        fallback.pk,
        503,
    )
    assert event.subject == f"inference-request:{result.request_id}" and event.time_lost is not None


def test_concurrent_folders_fold_each_entry_exactly_once(
    journal: list[int], owner: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    server = mock_provider(tokens_in=10, tokens_out=5)
    workflow = routed_workflow(owner, [priced_deployment(server)])
    ids = [route(workflow=workflow, request=PING).request_id for _ in range(40)]
    folded: list[int] = []

    def folder() -> None:
        from django.db import connection

        try:
            while (n := journal_fold(limit=3)) > 0:
                folded.append(n)
        finally:
            connection.close()

    threads = [threading.Thread(target=folder) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(folded) == 40 and journal_status()["pending"] == 0
    assert UsageRecord.objects.count() == 80  # input and output of each request, once
    assert InferenceAttempt.objects.filter(request_id__in=ids).count() == 40
    keys = list(UsageRecord.objects.values_list("idempotency_key", flat=True))
    assert len(keys) == len(set(keys))
    total = sum(InferenceRequest.objects.filter(pk__in=ids).values_list("cost", flat=True), Decimal(0))
    assert total == sum(UsageRecord.objects.values_list("amount", flat=True), Decimal(0))
    for partition in set(UsageRecord.objects.values_list("partition", flat=True)):
        assert ledger_verify(partition=partition).ok


def test_an_entry_that_cannot_be_folded_is_marked_and_does_not_hold_up_the_others(
    journal: list[int], owner: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    server = mock_provider(tokens_in=10, tokens_out=5)
    deployment = priced_deployment(server)
    workflow = routed_workflow(owner, [deployment])
    bad = route(workflow=workflow, request=PING).request_id
    good = route(workflow=workflow, request=PING).request_id
    # The bad entry's billed unit names a unit with no price: the ledger refuses to bill it.
    row = InferenceRequest.objects.get(pk=bad)
    doc = row.ledger_pending
    doc["billed"][0][1] = "cached_input_tokens_1m"
    InferenceRequest.objects.filter(pk=bad).update(ledger_pending=doc)

    assert journal_fold_all() == 1
    assert _ledger_rows(good) != [] and _ledger_rows(bad) == []
    status = journal_status()
    assert status["failed"] == 1 and status["pending"] == 0
    failed = InferenceRequest.objects.get(pk=bad).ledger_pending
    assert failed is not None and "no cached_input_tokens_1m price" in failed["error"]
    assert journal_fold_all() == 0  # left for an operator, not retried in a loop

    # The operator publishes the missing price and retries the failed entries.
    PriceBook.objects.create(
        unit="cached_input_tokens_1m",
        unit_price=Decimal("0.5"),
        deployment=deployment,
        effective_from=InferenceRequest.objects.get(pk=bad).created_at.replace(year=2000),
    )
    call_command("journal", "fold", "--retry-failed")
    assert InferenceRequest.objects.get(pk=bad).ledger_pending is None and _ledger_rows(bad) != []


def test_a_request_under_a_hard_budget_is_journaled_and_its_hold_lasts_until_the_fold(
    journal: list[int], owner: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    server = mock_provider(tokens_in=1_000_000, tokens_out=0)
    workflow = routed_workflow(owner, [priced_deployment(server)])
    _cap(workflow, Decimal("10"))
    result = route(workflow=workflow, request=PING)
    # Journaled like any request (one INSERT before the answer, the folder nudged), carrying
    # the reservation it still holds: the spend is not in the ledger yet, the hold is.
    row = InferenceRequest.objects.get(pk=result.request_id)
    period = BudgetPeriod.objects.get(budget__name="cap")
    assert journal == [1] and row.ledger_pending is not None
    assert period.spent == 0 and period.reserved > 0  # the call's worst case, from its request
    assert row.ledger_pending["holds"] == [[period.pk, str(period.reserved)]]
    # The fold commits the spend, then releases the hold: the cost is never counted zero times.
    assert journal_fold() == 1
    period.refresh_from_db()
    assert (period.spent, period.reserved) == (Decimal("1.000000000"), Decimal("0"))
    assert _ledger_rows(row.pk) == [("input_tokens_1m", Decimal("1.000000000"))]


def test_a_request_refused_by_an_unfolded_hold_folds_the_journal_and_is_admitted_at_the_real_cost(
    journal: list[int], owner: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    # A call's worst case (its 4,096 output tokens at 3 USD a million: about 0.0123) is held
    # until its fold; it really costs 0.000025. Under a limit of 0.01 the hold alone fills the
    # budget: the next request's router folds the journal, which puts the real cost in and
    # releases the hold, and asks again. The budget refuses at its limit, not at worst cases.
    server = mock_provider(tokens_in=10, tokens_out=5)
    workflow = routed_workflow(owner, [priced_deployment(server)])
    _cap(workflow, Decimal("0.01"))
    first = route(workflow=workflow, request=PING).request_id
    period = BudgetPeriod.objects.get(budget__name="cap")
    assert period.reserved >= Decimal("0.01") and period.spent == 0
    assert route(workflow=workflow, request=PING).ok
    assert InferenceRequest.objects.get(pk=first).ledger_pending is None  # folded by the second
    assert _ledger_rows(first) != []
    assert journal_fold() == 1  # the second's own entry
    period.refresh_from_db()
    assert (period.spent, period.reserved) == (Decimal("0.000050000"), Decimal("0"))
    # Spent to the limit, a request is refused (after the same fold, which finds nothing held).
    budget = Budget.objects.get(name="cap")
    budget.limit_amount = Decimal("0.00005")
    budget.save()
    with pytest.raises(BudgetExhausted):
        route(workflow=workflow, request=PING)


def test_the_beat_task_and_the_command_fold_what_a_dead_process_left(
    journal: list[int], owner: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    server = mock_provider(tokens_in=10, tokens_out=5)
    workflow = routed_workflow(owner, [priced_deployment(server)])
    first = route(workflow=workflow, request=PING).request_id
    assert tasks.journal_fold() == 1 and _ledger_rows(first) != []
    second = route(workflow=workflow, request=PING).request_id
    call_command("journal", "fold")
    assert _ledger_rows(second) != [] and journal_status()["pending"] == 0


def test_the_folder_thread_folds_journaled_requests_on_its_own(
    settings: Any, owner: User, mock_provider: Callable[..., MockProviderServer]
) -> None:
    settings.INFERENCE_RECORDING = "journal"
    server = mock_provider(tokens_in=10, tokens_out=5)
    workflow = routed_workflow(owner, [priced_deployment(server)])
    ids = [route(workflow=workflow, request=PING).request_id for _ in range(5)]
    # Wait for the thread (no timing is asserted: the loop only bounds how long the test waits).
    deadline = time.monotonic() + 60
    while InferenceRequest.objects.filter(pk__in=ids, ledger_pending__isnull=False).exists():
        assert time.monotonic() < deadline, "the folder thread did not fold the journal"
        time.sleep(0.05)
    assert UsageRecord.objects.filter(subject_id__in=[str(i) for i in ids]).count() == 10


def test_a_request_billed_to_another_subject_keeps_it_through_the_journal_and_inline(
    journal: list[int], owner: User, mock_provider: Callable[..., MockProviderServer], settings: Any
) -> None:
    """An eval run that scores a training run's model version bills the run (route's bill_to):
    the subject survives the journal entry, the request's cost still equals its ledger rows."""
    server = mock_provider(tokens_in=1000, tokens_out=500)
    workflow = routed_workflow(owner, [priced_deployment(server)])
    journaled = route(workflow=workflow, request=PING, bill_to="training_run:41")
    assert (
        InferenceRequest.objects.get(pk=journaled.request_id).ledger_pending["bill_to"] == "training_run:41"
    )
    assert journal_fold() == 1
    settings.INFERENCE_RECORDING = "inline"
    inline = route(workflow=workflow, request=PING, bill_to="training_run:41")
    rows = UsageRecord.objects.filter(subject_type="training_run", subject_id="41")
    assert rows.count() == 4 and not UsageRecord.objects.filter(subject_type="inference_request").exists()
    # Idempotency keys stay the request's: the fold's cost per request is unchanged.
    for result in (journaled, inline):
        own = rows.filter(idempotency_key__startswith=f"inference:{result.request_id}:")
        assert sum(own.values_list("amount", flat=True)) == result.cost == Decimal("0.002500000")
