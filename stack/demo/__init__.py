"""The demo beside the project: `manage.py demo` and `manage.py seed_demo`. The seeded stack
(seed), the loopback providers that answer the demo's workflows (providers) and the cost-quality
story it plays through a replay and its recommendations (cost_quality)."""
