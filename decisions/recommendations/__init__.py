"""Recommendations: proposals derived from a finished replay study, with their evidence, accepted
in one click or dismissed with a reason. Writes (services), reads with money recomputed from the
ledger (selectors), the API (api), pages (views) and the deriving task (tasks)."""
