"""Inference API viewsets, registered on the /api/ router by stack.urls."""

from __future__ import annotations

from rest_framework.routers import BaseRouter


def register(router: BaseRouter) -> None:
    """Add this app's viewsets to the /api/ router."""
    from inference import batch_api, chaos_api, quality_api

    chaos_api.register(router)
    quality_api.register(router)
    batch_api.register(router)
