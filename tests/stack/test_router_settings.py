"""The router's settings that docs/configuration.md lists (breakers, retries, deadlines, eval-run
leases, the anomaly floor) are read from the environment once, into typed values, and reach
the code that uses them; a bad value stops the process naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Printed by a fresh process: what the breakers, the router and the eval sweep will use.
PROBE = """
import django
django.setup()
from django.conf import settings
from inference.breaker.state import breaker_settings
cfg = breaker_settings()
print(repr((cfg.failure_rate, cfg.min_requests, cfg.window_calls, cfg.window_s, cfg.cooldown_s)))
print(repr((settings.INFERENCE_DEADLINE_SECONDS, settings.INFERENCE_MAX_ROUNDS,
            settings.INFERENCE_BACKOFF_SECONDS, settings.INFERENCE_MAX_RETRY_AFTER_SECONDS)))
print(repr((settings.EVAL_RUN_STALE_SECONDS, settings.ANOMALY_MIN_AMOUNT)))
"""


def _run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("INFERENCE_", "EVAL_RUN_", "SWITCHYARD_ANOMALY_"))
    }
    environ.update(DJANGO_SETTINGS_MODULE="stack.settings", SWITCHYARD_VAR_DIR=str(tmp_path / "var"), **env)
    return subprocess.run(  # noqa: S603 (this interpreter, a fixed script)
        [sys.executable, "-c", PROBE], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60
    )


def test_the_documented_defaults_apply_without_the_variables(tmp_path: Path) -> None:
    result = _run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "(0.5, 5, 20, 60.0, 10.0)",
        "(30.0, 2, 0.05, 300.0)",
        "(1800.0, Decimal('1.00'))",
    ]


def test_the_breaker_router_and_eval_variables_are_read_from_the_environment(tmp_path: Path) -> None:
    result = _run(
        tmp_path,
        INFERENCE_BREAKER_FAILURE_RATE="0.25",
        INFERENCE_BREAKER_MIN_REQUESTS="7",
        INFERENCE_BREAKER_WINDOW_CALLS="40",
        INFERENCE_BREAKER_WINDOW_SECONDS="120",
        INFERENCE_BREAKER_COOLDOWN_SECONDS="2.5",
        INFERENCE_DEADLINE_SECONDS="12",
        INFERENCE_MAX_ROUNDS="3",
        INFERENCE_BACKOFF_SECONDS="0.2",
        INFERENCE_MAX_RETRY_AFTER_SECONDS="60",
        EVAL_RUN_STALE_SECONDS="600",
        SWITCHYARD_ANOMALY_MIN_AMOUNT="2.50",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "(0.25, 7, 40, 120.0, 2.5)",
        "(12.0, 3, 0.2, 60.0)",
        "(600.0, Decimal('2.50'))",
    ]


def test_a_bad_value_stops_the_process_naming_the_variable(tmp_path: Path) -> None:
    for name, value in [
        ("INFERENCE_BREAKER_FAILURE_RATE", "1.5"),
        ("INFERENCE_BREAKER_MIN_REQUESTS", "0"),
        ("EVAL_RUN_STALE_SECONDS", "soon"),
        ("SWITCHYARD_ANOMALY_MIN_AMOUNT", "-1"),
    ]:
        result = _run(tmp_path, **{name: value})
        assert result.returncode != 0
        assert "ImproperlyConfigured" in result.stderr and name in result.stderr, (name, result.stderr[-500:])
