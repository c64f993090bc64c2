"""Training: probe jobs and multi-cluster DiLoCo runs (the engine is in training/engine)."""

from __future__ import annotations

from typing import Any


def demo_config() -> dict[str, Any]:
    """The demo's training-run config (see training.run_config.demo_config)."""
    # Imported on call: importing any of training.engine (pure torch, used without Django by the
    # engine benchmark and local serving) runs this file, which must not pull in Django or Celery.
    from training.run_config import demo_config as config

    return config()
