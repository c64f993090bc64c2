"""The decisions tests use the inference fixtures: loopback providers and clean breakers/caches."""

from __future__ import annotations

from tests.inference.conftest import _clean_inference_state, mock_provider

__all__ = ["_clean_inference_state", "mock_provider"]
