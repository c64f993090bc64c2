"""Cost-quality decisions (issue 18): build or buy, counterfactual replays, recommendations.

Rows here join the other apps' records (model versions, eval runs, batch jobs, ledger rows);
they never hold a figure the ledger cannot reproduce. One module per part:

- buildbuy: VersionEvaluation / VersionScore / ApiScore (each model version of a build-or-buy
  run served and scored on its workflows' eval sets, beside the API deployments of their routes)
- replay: ReplayStudy / ReplayCandidate / ReplayResult (kept requests replayed through
  candidate deployments off the request path, as billed batch jobs, and scored)
- recommendations: Recommendation (a proposed route change with its figures and evidence,
  accepted as a new routing-policy version or dismissed with a reason)
"""

from __future__ import annotations

from decisions.models.buildbuy import ApiScore, VersionEvaluation, VersionScore
from decisions.models.recommendations import Recommendation
from decisions.models.replay import ReplayCandidate, ReplayResult, ReplayStudy

__all__ = [
    "ApiScore",
    "Recommendation",
    "ReplayCandidate",
    "ReplayResult",
    "ReplayStudy",
    "VersionEvaluation",
    "VersionScore",
]
