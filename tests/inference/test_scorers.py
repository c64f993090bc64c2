"""Scorers: each compares an answer with its case's expectation; bad settings are refused early."""

from __future__ import annotations

from typing import Any

import pytest

from inference.quality.scorers import case_config_validate, judge_verdict, score_answer
from registry.services import RegistryError

SCHEMA = '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}'


@pytest.mark.parametrize(
    ("scorer", "expected", "config", "answer", "score"),
    [
        ("exact", "Paris", {}, "  Paris\n", 1.0),
        ("exact", "Paris", {}, "paris", 0.0),
        ("exact", "Paris", {"ignore_case": True}, "paris", 1.0),
        ("contains", "Paris", {}, "The capital is Paris.", 1.0),
        ("contains", "Paris", {}, "The capital is Lyon.", 0.0),
        ("regex", r"^\d{3}-\d{4}$", {}, "555-1234", 1.0),
        ("regex", r"^\d{3}-\d{4}$", {}, "call 555-1234", 0.0),
        ("json_schema", SCHEMA, {}, '{"n": 3}', 1.0),
        ("json_schema", SCHEMA, {}, '```json\n{"n": 3}\n```', 1.0),
        ("json_schema", SCHEMA, {}, '{"n": "three"}', 0.0),
        ("json_schema", SCHEMA, {}, "not json", 0.0),
        ("numeric", "42", {"tolerance": 0.5}, "about 42.4", 1.0),
        ("numeric", "42", {"tolerance": 0.5}, "about 43", 0.0),
        ("numeric", "1000", {"tolerance": 0.01, "relative": True}, "1,005", 1.0),
        ("numeric", "1000", {}, "no number here", 0.0),
    ],
)
def test_deterministic_scorers(
    scorer: str, expected: str, config: dict[str, Any], answer: str, score: float
) -> None:
    assert score_answer(scorer=scorer, expected=expected, config=config, answer=answer) == score


@pytest.mark.parametrize(
    ("scorer", "expected", "config", "has_judge", "field"),
    [
        ("regex", "([unclosed", {}, False, "expected"),
        ("json_schema", "{not json", {}, False, "expected"),
        ("json_schema", '{"type": "no-such-type"}', {}, False, "expected"),
        ("numeric", "forty-two", {}, False, "expected"),
        ("numeric", "42", {"tolerance": -1}, False, "scorer_config"),
        ("exact", "", {}, False, "expected"),
        ("exact", "x", {"tolerance": 1}, False, "scorer_config"),
        ("judge", "", {}, False, "judge_deployment"),
        ("telepathy", "x", {}, False, "scorer"),
    ],
)
def test_bad_case_settings_are_refused(
    scorer: str, expected: str, config: dict[str, Any], has_judge: bool, field: str
) -> None:
    with pytest.raises(RegistryError) as err:
        case_config_validate(scorer=scorer, expected=expected, config=config, has_judge=has_judge)
    assert err.value.field == field


def test_good_case_settings_pass() -> None:
    assert case_config_validate(scorer="regex", expected=r"\d+", config=None, has_judge=False) == {}
    assert case_config_validate(
        scorer="judge", expected="", config={"criteria": "polite"}, has_judge=True
    ) == {"criteria": "polite"}


@pytest.mark.parametrize(
    ("reply", "score"), [("0.8", 0.8), ("Score: 1", 1.0), ("7/10", 0.7), ("none", None), ("42", None)]
)
def test_judge_verdict(reply: str, score: float | None) -> None:
    assert judge_verdict(reply) == score
