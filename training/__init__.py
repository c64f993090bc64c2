"""Training: probe jobs and multi-cluster DiLoCo runs (the engine is in training/engine)."""

from __future__ import annotations

from typing import Any


def demo_config() -> dict[str, Any]:
    """The demo's training-run config (see training.run_config.demo_config)."""
    from training.run_config import demo_config as config

    return config()
