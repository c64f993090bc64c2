"""Reading the fields of a model's ``config.json`` with messages that name the bad key."""

from __future__ import annotations

import math
from typing import Any


class ModelConfigError(ValueError):
    """A config.json this engine cannot build a model from (the message says why)."""


def hf_int(d: dict[str, Any], key: str, default: int | None = None, *, minimum: int = 1) -> int:
    """An integer field of a config.json, or ModelConfigError naming the key."""
    value = d.get(key, default)
    if value is None:
        raise ModelConfigError(f"config.json: {key} is required")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ModelConfigError(f"config.json: {key} must be an integer of at least {minimum}, got {value!r}")
    return value


def hf_float(d: dict[str, Any], key: str, default: float | None = None) -> float:
    """A number field of a config.json, or ModelConfigError naming the key."""
    value = d.get(key, default)
    if value is None:
        raise ModelConfigError(f"config.json: {key} is required")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ModelConfigError(f"config.json: {key} must be a finite number, got {value!r}")
    return float(value)


def hf_bool(d: dict[str, Any], key: str, default: bool) -> bool:
    """A true/false field of a config.json, or ModelConfigError naming the key."""
    value = d.get(key, default)
    if not isinstance(value, bool):
        raise ModelConfigError(f"config.json: {key} must be true or false, got {value!r}")
    return value
