"""Counterfactual routing replays: replay a workflow's kept requests through candidate
deployments and compare cost, quality and latency. Creating and running a study (services), its
figures (figures, pure), reads (selectors), the API (api), pages (views) and tasks (tasks)."""
