"""Cost-quality decisions (issue 18): build or buy, counterfactual replays, recommendations.

Rows here join the other apps' records (model versions, eval runs, batch jobs, ledger rows);
they never hold a figure the ledger cannot reproduce.
"""

from __future__ import annotations
