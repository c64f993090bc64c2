"""Cost-quality decisions (issue 18): build or buy, counterfactual replays, recommendations.

Rows here join the other apps' records (model versions, eval runs, batch jobs, ledger rows);
they never hold a figure the ledger cannot reproduce. One module per part:

- replay: ReplayStudy / ReplayCandidate / ReplayResult (kept requests replayed through
  candidate deployments off the request path, as billed batch jobs, and scored)
- recommendations: Recommendation (a proposed route change with its figures and evidence,
  accepted as a new routing-policy version or dismissed with a reason)
"""

from __future__ import annotations

from stack.decisions.models.recommendations import Recommendation
from stack.decisions.models.replay import ReplayCandidate, ReplayResult, ReplayStudy

__all__ = ["Recommendation", "ReplayCandidate", "ReplayResult", "ReplayStudy"]
