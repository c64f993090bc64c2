"""A hard key budget under 20 concurrent /v1 calls (issue 25 finding 5): real threads, real
connections, committed transactions. Each admitted call holds its worst case (the 1,000-token
tool counted) until its cost is in the ledger, so the budget is overspent by at most one call."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from decimal import Decimal

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.db.models import Sum
from django.test import Client

from bench.mockprovider import MockProviderServer
from billing.models import UsageRecord
from stack.keys import KeyBudget, api_key_issue
from tests.factories import make_team
from tests.helpers import ledger_settled
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db(transaction=True)
Start = Callable[..., MockProviderServer]
THREADS = 20
TOOL = {
    "type": "function",
    "function": {"name": "lookup", "description": "x" * 3900, "parameters": {"type": "object"}},
}


def test_twenty_concurrent_calls_overspend_a_hard_key_budget_by_at_most_one_calls_worst_case(
    operator: User, mock_provider: Start
) -> None:
    # The provider bills 1,000 prompt tokens (the tool) and 3 completion tokens; at $200 per
    # million tokens each way that is $0.2006 a call, and the worst case reserved for a call
    # (its ~1,010 input tokens by the estimate plus max_tokens 3) is under $0.21.
    server = mock_provider(text="ok", tokens_in=1000, tokens_out=3, delay_ms=300)
    team = make_team("search")
    deployment = priced_deployment(server, in_price=Decimal("200"), out_price=Decimal("200"))
    workflow = routed_workflow(operator, [deployment], team=team)
    limit = Decimal("1")
    issued = api_key_issue(
        user=operator, name="budgeted", team=team, budget=KeyBudget(limit_amount=limit, period="daily")
    )
    body = json.dumps(
        {
            "model": workflow.slug,
            "messages": [{"role": "user", "content": "ping"}],
            "tools": [TOOL],
            "max_tokens": 3,
        }
    )
    statuses: list[int] = []
    codes: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def call() -> None:
        try:
            client = Client(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
            start.wait()
            response = client.post("/v1/chat/completions", body, content_type="application/json")
            statuses.append(response.status_code)
            if response.status_code != 200:
                codes.append(response.json()["error"]["code"])
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=call) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert len(statuses) == THREADS
    ledger_settled()  # the journaled answers' spend, folded as the folder thread would
    spent = UsageRecord.objects.filter(api_key_id=issued.token.pk).aggregate(t=Sum("amount"))["t"]
    answered = statuses.count(200)
    assert answered >= 1
    assert spent == Decimal("0.2006") * answered
    assert spent <= limit + Decimal("0.21")  # the bound: the limit plus one call's worst case
    assert set(statuses) <= {200, 402} and set(codes) <= {"budget_exhausted"}
    assert server.behaviour.total_calls() == answered  # a refused call reached no provider
