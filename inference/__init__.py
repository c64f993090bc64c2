"""Inference: provider adapters, the router, the OpenAI-compatible gateway, local serving,
eval sets and quality scores, batch jobs.

The routing policies it executes are versioned in the registry
(registry.models.RoutingPolicyVersion); docs/inference-internals.md maps the modules.
"""
