"""Admission (inference.admission), issue 25 findings 4 and 5: every provider call, whoever makes
it, counts against the same rate-limit windows as /v1 (jobs wait for room, /v1 answers 429), and a
hard budget reserves each call's worst case counted from the whole request."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.test import APIClient

from bench.mockprovider import MockProviderServer
from inference import admission, tasks
from inference.adapters.base import ChatMessage, ChatRequest, CompletionRequest
from inference.batch import jobs as batch
from inference.models import BatchJob, EvalRun
from inference.quality import services as quality
from inference.ratelimit.limits import rate_limiter_reset
from inference.router.context import context_tokens, cost_estimate
from registry.models import Deployment, Team, Workflow
from stack.keys import IssuedKey, api_key_issue
from tests.factories import make_team
from tests.inference.helpers import priced_deployment, routed_workflow

pytestmark = pytest.mark.django_db
Start = Callable[..., MockProviderServer]

# A tool whose JSON schema is about 1,000 tokens (4,000 bytes at 4 bytes a token).
BIG_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "x" * 3900,
        "parameters": {"type": "object", "properties": {}},
    },
}


# --- The estimate: the whole request -----------------------------------------------------------------


def test_a_calls_token_count_includes_its_tools_images_and_template_overhead(settings: Any) -> None:
    settings.INFERENCE_IMAGE_TOKENS = 1600
    bare = ChatRequest(messages=(ChatMessage("user", "ping"),), max_tokens=3)
    with_tool = ChatRequest(messages=(ChatMessage("user", "ping"),), max_tokens=3, tools=(BIG_TOOL,))
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 40_000}}
    with_image = ChatRequest(messages=(ChatMessage("user", "ping", parts=(image,)),), max_tokens=3)
    # "ping" 1, its message's template 4, the reply's priming 3, then max_tokens.
    assert context_tokens(bare) == 1 + 4 + 3 + 3
    assert context_tokens(with_tool) - context_tokens(bare) >= 1000
    assert context_tokens(with_image) - context_tokens(bare) == 1600  # per image, not its bytes
    # Text is counted by its UTF-8 bytes: a script of three bytes a character counts three times
    # what characters / 4 would have said.
    assert context_tokens(CompletionRequest(prompt="日本語" * 100)) == 225 + 1


def test_the_worst_case_reserved_prices_the_tools_and_max_tokens_or_the_deployments_maximum(
    settings: Any,
) -> None:
    settings.INFERENCE_MAX_OUTPUT_TOKENS = 4096
    million = Decimal(1_000_000)
    entry: Any = _entry(input_price=million, output_price=2 * million)
    small = ChatRequest(messages=(ChatMessage("user", "ping"),), max_tokens=3)
    tools = ChatRequest(messages=(ChatMessage("user", "ping"),), max_tokens=3, tools=(BIG_TOOL,))
    # $1 an input token, $2 an output token: the estimate is tokens in + 2 × tokens out.
    assert cost_estimate(entry, small) == Decimal(8 + 2 * 3)
    assert cost_estimate(entry, tools) >= Decimal(1000 + 8 + 2 * 3)
    unbounded = ChatRequest(messages=(ChatMessage("user", "ping"),), n=2)
    assert cost_estimate(entry, unbounded) == Decimal(8 + 2 * 4096 * 2)  # n answers of the default
    entry.max_context_tokens = 1008
    assert cost_estimate(entry, unbounded) == Decimal(8 + 2 * 1000 * 2)  # the context window's rest


def _entry(**prices: Decimal) -> Any:
    fields = ("input", "output", "cached_input", "cache_write", "reasoning", "batch_input", "batch_output")
    return SimpleNamespace(
        **{f"{f}_price": prices.get(f"{f}_price") for f in fields}, max_context_tokens=None
    )


def test_the_worst_case_prices_each_token_at_the_dearest_unit_it_may_be_billed_in() -> None:
    """A hard budget's reservation is an upper bound of what the ledger bills (billable_units):
    reasoning tokens dearer than output are reserved at their price, input tokens at the
    cache-write price where it is dearer than input; a batch line at the batch prices, where
    there are any, else at the interactive ones."""
    m = Decimal(1_000_000)
    small = ChatRequest(messages=(ChatMessage("user", "ping"),), max_tokens=3)  # 8 in, 3 out
    plain = _entry(input_price=m, output_price=2 * m)
    assert cost_estimate(plain, small) == cost_estimate(plain, small, batch=True) == Decimal(8 + 2 * 3)
    reasoning = _entry(input_price=m, output_price=2 * m, reasoning_price=5 * m, cached_input_price=m / 4)
    assert cost_estimate(reasoning, small) == Decimal(8 + 5 * 3)
    written = _entry(
        input_price=m, output_price=2 * m, cached_input_price=m / 10, cache_write_price=m * 5 / 4
    )
    assert cost_estimate(written, small) == Decimal(10 + 2 * 3)  # 8 tokens at 1.25 each
    batch = _entry(input_price=m, output_price=2 * m, batch_input_price=m / 2, batch_output_price=m)
    assert cost_estimate(batch, small) == Decimal(8 + 2 * 3)
    assert cost_estimate(batch, small, batch=True) == Decimal(4 + 3)


# --- Rate limits: every caller kind counts in the key's window -------------------------------------


@pytest.fixture
def frozen(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Windows in this process (time-machine moves them) with a frozen clock; a job's wait moves
    the clock on instead of sleeping. Yields the provider calls made before each wait."""
    settings.RATE_LIMIT_REDIS_URL = ""
    settings.RATE_LIMIT_WINDOW_SECONDS = 60.0
    rate_limiter_reset()
    waits: list[int] = []
    with time_machine.travel(datetime(2026, 12, 4, 12, 0, tzinfo=UTC), tick=False) as traveller:

        def wait(seconds: float) -> None:
            waits.append(calls())
            traveller.shift(seconds)

        monkeypatch.setattr(admission, "_sleep", wait)
        yield waits
    rate_limiter_reset()


calls: Callable[[], int] = lambda: 0  # noqa: E731 (set by each test to its provider's counter)


def _team_setup(operator: User, server: MockProviderServer) -> tuple[Team, Deployment, Workflow, IssuedKey]:
    global calls
    calls = server.behaviour.total_calls
    team = make_team("search")
    deployment = priced_deployment(server)
    workflow = routed_workflow(operator, [deployment], team=team)
    issued = api_key_issue(user=operator, name="rpm3", team=team, rpm_limit=3)
    return team, deployment, workflow, issued


def _v1(issued: IssuedKey, workflow: Workflow) -> int:
    body = {"model": workflow.slug, "messages": [{"role": "user", "content": "ping"}]}
    client = Client(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    return client.post("/v1/chat/completions", json.dumps(body), content_type="application/json").status_code


def test_v1_answers_429_once_the_keys_rpm_is_spent(
    operator: User, mock_provider: Start, frozen: list[int]
) -> None:
    server = mock_provider(text="ok")
    _, _, workflow, issued = _team_setup(operator, server)
    assert [_v1(issued, workflow) for _ in range(4)] == [200, 200, 200, 429]
    assert server.behaviour.total_calls() == 3


def test_an_eval_run_asked_for_with_a_key_paces_its_calls_in_the_keys_v1_window(
    operator: User, mock_provider: Start, frozen: list[int]
) -> None:
    server = mock_provider(text="Paris")
    _, deployment, workflow, issued = _team_setup(operator, server)
    eval_set = quality.eval_set_create(
        workflow=workflow,
        name="capitals",
        cases=[{"prompt": f"Capital {i}?", "expected": "Paris", "scorer": "exact"} for i in range(10)],
        user=operator,
    )
    # Two /v1 requests of the key first: the run's calls share their window.
    assert [_v1(issued, workflow) for _ in range(2)] == [200, 200]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    response = client.post(
        "/api/eval-runs/", {"eval_set": eval_set.pk, "deployment": deployment.slug}, format="json"
    )
    assert response.status_code == 201, response.content
    tasks.eval_set_run.apply(args=(response.json()["id"],))
    run = EvalRun.objects.get(pk=response.json()["id"])
    assert (run.state, run.cases_done, run.mean_score) == (EvalRun.State.SUCCEEDED, 10, 1.0)
    # Never more than 3 calls in a window: 2 of /v1 and 1 of the run, then 3 a window (a wait
    # is at most admission.MAX_WAIT_S, so each full window is waited out in several).
    assert sorted(set(frozen)) == [3, 6, 9]
    assert server.behaviour.total_calls() == 12
    # And the run's last calls fill the window /v1 answers from.
    assert _v1(issued, workflow) == 429


def test_a_batch_job_with_a_key_paces_its_lines_in_the_keys_v1_window(
    operator: User, mock_provider: Start, frozen: list[int], settings: Any, tmp_path: Any
) -> None:
    settings.OBJECT_STORE_URL = f"file://{tmp_path / 'objects'}"
    server = mock_provider(text="ok")
    _, _, workflow, issued = _team_setup(operator, server)
    lines = "".join(
        json.dumps({"custom_id": f"c{i}", "messages": [{"role": "user", "content": "hi"}]}) + "\n"
        for i in range(5)
    )
    job = batch.batch_job_create(
        workflow=workflow, user=operator, input_jsonl=lines, api_key=issued.token, enqueue=False
    )
    assert _v1(issued, workflow) == 200
    tasks.batch_job_run.apply(args=(job.pk,))
    job.refresh_from_db()
    assert (job.state, job.done) == (BatchJob.State.SUCCEEDED, 5)
    assert set(frozen) == {3}  # 1 of /v1 and 2 lines, then the other 3 in the next window


def test_an_eval_run_without_a_key_as_build_or_buy_starts_them_paces_in_the_workflows_window(
    operator: User, mock_provider: Start, frozen: list[int]
) -> None:
    server = mock_provider(text="Paris")
    _, deployment, workflow, issued = _team_setup(operator, server)
    Workflow.objects.filter(pk=workflow.pk).update(rpm_limit=2)
    workflow.refresh_from_db()
    eval_set = quality.eval_set_create(
        workflow=workflow,
        name="capitals",
        cases=[{"prompt": f"Capital {i}?", "expected": "Paris", "scorer": "exact"} for i in range(5)],
        user=operator,
    )
    # Build or buy (decisions.buildbuy.services) starts its eval runs this way: no key, no enqueue.
    run = quality.eval_run_start(eval_set=eval_set, deployment=deployment, bill_to="", enqueue=False)
    run = quality.eval_run_execute(run_id=run.pk)
    assert run is not None and (run.state, run.cases_done) == (EvalRun.State.SUCCEEDED, 5)
    assert sorted(set(frozen)) == [2, 4]
    # The run's fifth call is in the window /v1 answers from: one more fits, not two.
    assert [_v1(issued, workflow) for _ in range(2)] == [200, 429]
