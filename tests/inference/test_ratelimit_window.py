"""The sliding-window arithmetic (inference.ratelimit.window) on a clock the test moves: the
in-process store the embedded demo uses, and the reference of the Redis script."""

from __future__ import annotations

from inference.ratelimit.limits import duration_text
from inference.ratelimit.window import REQUESTS, TOKENS, Limit, LocalWindows


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_the_window_refuses_past_the_limit_and_admits_again_once_the_oldest_slot_has_left() -> None:
    clock = Clock()
    store = LocalWindows(60.0, clock)
    rpm = Limit("key", 1, REQUESTS, 3)
    for _ in range(3):
        assert store.decide([rpm], [1]).allowed
        clock.now += 1.0
    refused = store.decide([rpm], [1])
    assert not refused.allowed
    assert refused.retry_after_s is not None and 0 < refused.retry_after_s <= 60
    clock.now += refused.retry_after_s
    assert store.decide([rpm], [1]).allowed


def test_all_or_nothing_a_refusal_by_one_limit_counts_against_none() -> None:
    clock = Clock()
    store = LocalWindows(60.0, clock)
    key_tpm = Limit("key", 1, TOKENS, 100)
    workflow_rpm = Limit("workflow", 9, REQUESTS, 10)
    assert not store.decide([workflow_rpm, key_tpm], [1, 150]).allowed
    decision = store.decide([workflow_rpm, key_tpm], [1, 50])
    assert decision.allowed
    assert [u.used for u in decision.usages] == [1, 50]


def test_a_cost_above_the_limit_never_passes_and_a_correction_frees_tokens() -> None:
    clock = Clock()
    store = LocalWindows(60.0, clock)
    tpm = Limit("key", 1, TOKENS, 100)
    assert store.decide([tpm], [101]).retry_after_s is None
    first = store.decide([tpm], [90])
    assert not store.decide([tpm], [20]).allowed
    store.correct(tpm, first.slot, 10 - 90)
    assert store.decide([tpm], [20]).usages[0].used == 30


def test_durations_read_as_openai_writes_them() -> None:
    assert duration_text(0.02) == "20ms"
    assert duration_text(1.5) == "1.5s"
    assert duration_text(360) == "6m0s"
