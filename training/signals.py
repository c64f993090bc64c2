"""Signals training sends for the apps above it (which training never imports).

model_version_registered: a ModelVersion row was committed (training.services.lineage sends it
after COMMIT, once per version). Keyword arguments: version_id, run_id. Receivers enqueue their
own work (decisions scores the version for a build-or-buy run); they must not raise, and a
receiver that missed one (a process killed in between) catches up from the table instead.
"""

from __future__ import annotations

from django.dispatch import Signal

model_version_registered = Signal()
