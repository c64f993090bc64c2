"""Build or buy: for a trained model, score each registered version and the API deployments it
is compared with, and decide per workflow which to use. The writes and the stop rule (services),
the pure arithmetic and decision rules (maths, decide), the report (selectors), its panel figure
(charts), its API (api, urls), the run-option check (checks) and the scoring tasks (tasks)."""
