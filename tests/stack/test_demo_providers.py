"""The demo's labelling providers: right by keyword, wrong on their share, stable across replays,
and a judge that grades against the true category."""

from __future__ import annotations

import json
import urllib.request

from inference.quality.scorers import judge_prompt, judge_verdict
from stack.demo.providers import CATEGORIES, LabelProvider, demo_ticket, label, ticket_prompt


def _ask(base_url: str, content: str) -> dict:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]}).encode()
    request = urllib.request.Request(  # noqa: S310 (loopback)
        f"{base_url}/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 (loopback)
        return json.load(response)


def test_a_labeller_without_errors_gets_every_demo_ticket_right() -> None:
    tickets = [demo_ticket(n) for n in range(200)]
    assert {category for _, category in tickets} == set(CATEGORIES)
    assert all(label(ticket_prompt(text), error_share=0.0) == truth for text, truth in tickets)


def test_a_labeller_is_wrong_on_about_its_share_and_a_larger_share_includes_its_mistakes() -> None:
    tickets = [demo_ticket(n) for n in range(1000)]

    def wrong(share: float) -> set[str]:
        return {text for text, truth in tickets if label(ticket_prompt(text), error_share=share) != truth}

    assert 60 <= len(wrong(0.1)) <= 140
    assert wrong(0.1) == wrong(0.1)
    assert wrong(0.05) < wrong(0.1)


def test_the_provider_answers_over_http_and_judges_against_the_true_category() -> None:
    provider = LabelProvider(name="large", error_share=0.0).start()
    try:
        text, truth = demo_ticket(7)
        answer = _ask(provider.base_url, ticket_prompt(text))
        assert answer["choices"][0]["message"]["content"] == truth
        assert answer["usage"]["prompt_tokens"] > 0
        wrong = next(c for c in CATEGORIES if c != truth)
        for graded, expected in ((truth, 1.0), (wrong, 0.0)):
            verdict = _ask(
                provider.base_url, judge_prompt(prompt=ticket_prompt(text), expected="", answer=graded)
            )
            assert judge_verdict(verdict["choices"][0]["message"]["content"]) == expected
        assert provider.calls == 3
    finally:
        provider.stop()
