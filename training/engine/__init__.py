"""Switchyard's DiLoCo engine: pure torch, no Django.

DiLoCo (arXiv 2311.08105), Streaming DiLoCo (arXiv 2501.18512) and Decoupled DiLoCo
(arXiv 2604.21428) at small scale. See docs/training-engine.md for the API.
"""

from __future__ import annotations

from training.engine.config import (
    CompressionConfig,
    DataConfig,
    InnerConfig,
    ModelConfig,
    OuterConfig,
    StreamingConfig,
    SyncerConfig,
)

__all__ = [
    "CompressionConfig",
    "DataConfig",
    "InnerConfig",
    "ModelConfig",
    "OuterConfig",
    "StreamingConfig",
    "SyncerConfig",
]
