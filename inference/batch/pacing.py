"""The rate limits a batch line counts against (its calls are paced by inference.admission).

A batch line counts against the same windows as a /v1 request (inference.ratelimit.limits: the same
Redis keys): its API key's limits, its key's team's (or, for a job asked for from a page, its
workflow's team's), the workflow's, and the job's own `max_rpm` (scope "batch"). Where /v1
answers 429, a line waits until the window lets it through (inference.admission.call_pace), so
a replay never takes the capacity live traffic was promised and never fails for being fast. A
line larger than a token limit can ever admit fails with that reason (waiting would not help).
"""

from __future__ import annotations

from inference.admission import call_limits, job_team
from inference.models import BatchJob
from inference.ratelimit.window import Limit


def batch_limits(job: BatchJob) -> list[Limit]:
    """The limits a line of `job` counts against (the /v1 ones of its key, team and workflow)."""
    workflow, key = job.workflow, job.api_key
    return call_limits(
        workflow=workflow,
        api_key=key,
        team=job_team(workflow=workflow, api_key=key),
        extra=(("batch", job.pk, job.max_rpm, None),),
    )
