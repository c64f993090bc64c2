"""The training benchmark's parts that need no workers: its health timings and the resume figure.

The figures themselves are measured by `manage.py bench training`, never asserted here; these
tests check what the bench runs with and that the resume comparison compares like with like.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings

from bench.training.resume import resume_bench
from bench.training.runs import HEALTH_PROFILES, bench_config, run_timings
from training.run_config.schema import DEFAULTS


def test_the_shipped_profile_is_the_settings_defaults() -> None:
    """`bench training` without --fast-health runs what an installation runs by default."""
    shipped = HEALTH_PROFILES["shipped"]
    defaults = {
        "SWITCHYARD_HEARTBEAT_SECONDS": 5.0,
        "SWITCHYARD_DEGRADED_AFTER_SECONDS": 15.0,
        "SWITCHYARD_DOWN_AFTER_SECONDS": 30.0,
        "SWITCHYARD_HEALTH_CHECK_SECONDS": 5.0,
        "SWITCHYARD_TRAINING_SUPERVISE_SECONDS": 3.0,
    }
    assert {k: float(v) for k, v in shipped.items()} == defaults
    # The settings module reads them with these defaults when the environment names none.
    source = "".join(
        path.read_text() for path in (Path(settings.BASE_DIR) / "stack" / "settings").glob("*.py")
    )
    for name, value in defaults.items():
        assert f'"{name}", {value}' in source, name
    assert set(HEALTH_PROFILES["fast"]) == set(defaults)


def test_the_shipped_run_has_the_run_config_defaults_and_fast_is_shorter() -> None:
    """A user's run gets the run-config defaults; the shipped bench must run those, not its own."""
    shipped = run_timings(bench_config(outer_steps=1, region="none"))
    assert shipped == {
        "chunk_seconds": DEFAULTS["chunk_seconds"],
        "learner_timeout": DEFAULTS["learner_timeout"],
        "syncer_grace_seconds": DEFAULTS["syncer"]["grace_seconds"],
    }
    fast = run_timings(bench_config(outer_steps=1, region="none", profile="fast"))
    assert all(fast[name] < shipped[name] for name in shipped)


def test_a_learner_resumed_from_its_checkpoint_ends_where_the_uninterrupted_one_does() -> None:
    cfg: dict[str, Any] = bench_config(outer_steps=1, region="none")
    cfg["model"] = {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16}
    cfg["data"] = {"max_train_bytes": 50_000, "max_eval_bytes": 5_000}
    cfg["learners"]["batch_size"] = 4
    cfg["eval_windows"] = 8
    out = resume_bench(cfg, steps=20)
    assert out["resumed_after"] == 10 and out["checkpoint_bytes"] > 0
    # Weights, AdamW moments, step counters and the data position all came back: bit for bit.
    assert out["max_param_abs_diff"] == 0.0
    assert out["resume_loss_ratio"] == 1.0
