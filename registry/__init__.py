"""The registry: teams and members, providers, clusters, models, deployments, workflows and their
routing-policy versions, API keys, roles and the principal, the outbound guard, the audit trail.
Every app imports it; it imports no other app (the import-linter contracts in pyproject.toml)."""
