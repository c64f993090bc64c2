"""Inference: provider adapters, the router, the OpenAI-compatible gateway.

The routing policies it executes are versioned in the registry
(stack.registry.models.RoutingPolicyVersion); the gateway itself is built by the
inference-gateway issue.
"""
