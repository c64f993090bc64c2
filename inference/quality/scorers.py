"""Scorers for eval cases: how a deployment's answer is compared with the case's expectation.

Every scorer returns a score in [0, 1]. `expected` holds what the scorer compares with: the exact
text, the substring, the regular expression, the JSON schema (as JSON text) or the number;
`scorer_config` holds options (`ignore_case` for exact/contains/regex, `tolerance` and
`relative` for numeric). The judge scorer asks another deployment (inference.quality.services runs that
call); here it only builds the judge's prompt and reads its verdict.

`case_config_validate` is called when a case is created, so a bad regex or schema is refused
then, not discovered in the middle of an eval run.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from jsonschema import exceptions as jsonschema_exceptions
from jsonschema import validators

from registry.services import RegistryError

EXACT = "exact"
CONTAINS = "contains"
REGEX = "regex"
JSON_SCHEMA = "json_schema"
NUMERIC = "numeric"
JUDGE = "judge"
SCORERS = (EXACT, CONTAINS, REGEX, JSON_SCHEMA, NUMERIC, JUDGE)

_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_CONFIG_KEYS = {
    EXACT: {"ignore_case"},
    CONTAINS: {"ignore_case"},
    REGEX: {"ignore_case"},
    JSON_SCHEMA: set(),
    NUMERIC: {"tolerance", "relative"},
    JUDGE: {"criteria"},
}


def case_config_validate(
    *, scorer: str, expected: str, config: dict[str, Any] | None, has_judge: bool
) -> dict[str, Any]:
    """Check a case's scorer settings; returns the config to store. RegistryError names the field."""
    if scorer not in SCORERS:
        raise RegistryError(f"scorer must be one of {', '.join(SCORERS)}", field="scorer")
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise RegistryError("scorer_config must be an object", field="scorer_config")
    config = dict(config)
    unknown = set(config) - _CONFIG_KEYS[scorer]
    if unknown:
        raise RegistryError(
            f"unknown option(s) for the {scorer} scorer: {', '.join(sorted(unknown))}", field="scorer_config"
        )
    for flag in ("ignore_case", "relative"):
        if flag in config and not isinstance(config[flag], bool):
            raise RegistryError(f"{flag} must be true or false", field="scorer_config")
    if scorer in (EXACT, CONTAINS, REGEX) and expected == "":
        raise RegistryError(f"the {scorer} scorer needs an expected value", field="expected")
    if scorer == REGEX:
        try:
            re.compile(expected)
        except re.error as exc:
            raise RegistryError(f"not a valid regular expression: {exc}", field="expected") from None
    elif scorer == JSON_SCHEMA:
        _schema_validator(expected)
    elif scorer == NUMERIC:
        _expected_number(expected)
        tolerance = config.get("tolerance", 0)
        if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not tolerance >= 0:
            raise RegistryError("tolerance must be a number >= 0", field="scorer_config")
    elif scorer == JUDGE:
        if not has_judge:
            raise RegistryError("the judge scorer needs a judge deployment", field="judge_deployment")
        if "criteria" in config and not isinstance(config["criteria"], str):
            raise RegistryError("criteria must be text", field="scorer_config")
    return config


def _schema_validator(expected: str) -> Any:
    try:
        schema = json.loads(expected)
    except ValueError as exc:
        raise RegistryError(f"the JSON schema is not valid JSON: {exc}", field="expected") from None
    if not isinstance(schema, dict | bool):
        raise RegistryError("the JSON schema must be an object", field="expected")
    cls = validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema_exceptions.SchemaError as exc:
        raise RegistryError(f"not a valid JSON schema: {exc.message}", field="expected") from None
    return cls(schema)


def _expected_number(expected: str) -> float:
    try:
        value = float(expected.strip())
    except ValueError:
        raise RegistryError(
            "the numeric scorer needs a number as the expected value", field="expected"
        ) from None
    if not math.isfinite(value):
        raise RegistryError("the expected number must be finite", field="expected")
    return value


def score_answer(*, scorer: str, expected: str, config: dict[str, Any], answer: str) -> float:
    """Score `answer` with a deterministic scorer (every scorer but the judge): 1.0 or 0.0."""
    ignore_case = bool(config.get("ignore_case", False))
    if scorer == EXACT:
        a, e = answer.strip(), expected.strip()
        return 1.0 if (a.casefold() == e.casefold() if ignore_case else a == e) else 0.0
    if scorer == CONTAINS:
        return (
            1.0 if (expected.casefold() in answer.casefold() if ignore_case else expected in answer) else 0.0
        )
    if scorer == REGEX:
        flags = re.IGNORECASE if ignore_case else 0
        return 1.0 if re.search(expected, answer, flags) else 0.0
    if scorer == JSON_SCHEMA:
        validator = _schema_validator(expected)
        try:
            document = json.loads(_strip_code_fence(answer))
        except ValueError:
            return 0.0
        return 0.0 if any(True for _ in validator.iter_errors(document)) else 1.0
    if scorer == NUMERIC:
        target = _expected_number(expected)
        match = _NUMBER.search(answer.replace(",", ""))
        if match is None:
            return 0.0
        value = float(match.group())
        tolerance = float(config.get("tolerance", 0))
        if config.get("relative"):
            tolerance *= abs(target)
        return 1.0 if abs(value - target) <= tolerance else 0.0
    raise ValueError(f"{scorer} is not a deterministic scorer")


def _strip_code_fence(text: str) -> str:
    """Models often wrap JSON in a Markdown code fence; the fence is not part of the document."""
    stripped = text.strip()
    if stripped.startswith("```"):
        stripped = stripped.split("\n", 1)[1] if "\n" in stripped else ""
        stripped = stripped.rsplit("```", 1)[0]
    return stripped.strip()


def judge_prompt(*, prompt: str, expected: str, answer: str, criteria: str = "") -> str:
    """The question put to the judge deployment (LLM-as-a-judge, Zheng et al. 2023, arXiv:2306.05685)."""
    lines = [
        "You are grading an answer. Reply with one number between 0 and 1 (1 = fully correct), nothing else.",
        f"Question:\n{prompt}",
    ]
    if expected:
        lines.append(f"Reference answer:\n{expected}")
    if criteria:
        lines.append(f"Criteria:\n{criteria}")
    lines.append(f"Answer to grade:\n{answer}")
    return "\n\n".join(lines)


def judge_verdict(text: str) -> float | None:
    """The judge's score: the first number in its reply, in [0, 1]; None when there is none.

    A reply on a 0-10 scale (a number above 1 and at most 10) is read as tenths, a common
    deviation from the instruction.
    """
    match = _NUMBER.search(text)
    if match is None:
        return None
    value = float(match.group())
    if not math.isfinite(value) or value < 0:
        return None
    if value > 1:
        if value > 10:
            return None
        value /= 10
    return value
