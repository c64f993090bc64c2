"""Export jobs: recorded, run on the control queue into the object store, and their files read back."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from billing.exports.columns import MANIFEST_NAME
from billing.exports.filters import ExportFilters, export_formats_clean
from billing.exports.manifest import export_write_files
from billing.models import ExportJob
from registry.claims import row_claim
from registry.models import Team
from registry.queues import CONTROL_QUEUE, task_send
from registry.store.objectstore import default_store

EXPORT_JOB_RUN = "billing.export_job_run"  # billing.tasks registers it under this name

if TYPE_CHECKING:
    from django.contrib.auth.models import User

logger = logging.getLogger(__name__)


def export_job_prefix(job_id: int) -> str:
    """Where a job's files live in the object store."""
    return f"exports/{job_id}/"


def export_job_claim(*, job_id: int) -> bool:
    """Claim a job to run: True unless it is finished or gone.

    A job still `running` is claimed again: its worker died and the broker
    redelivered the message; the run starts over and overwrites the same keys.
    """
    return row_claim(
        ExportJob,
        pk=job_id,
        field="status",
        from_states=[ExportJob.Status.PENDING, ExportJob.Status.RUNNING],
        to_state=ExportJob.Status.RUNNING,
        started_at=timezone.now(),
        error="",
    )


def export_job_run(*, job_id: int) -> ExportJob | None:
    """Run an export job: files and a signed manifest under exports/<id>/ in the object store.

    Idempotent: a finished (or deleted) job is a no-op and returns None.
    """
    if not export_job_claim(job_id=job_id):
        return None
    job = ExportJob.objects.get(pk=job_id)
    prefix = export_job_prefix(job_id)
    try:
        with tempfile.TemporaryDirectory(prefix="switchyard-export-") as tmp:
            manifest = export_write_files(
                filters=ExportFilters.from_json(job.filters),
                formats=job.formats,
                directory=Path(tmp),
                job_id=job_id,
            )
            store = default_store()
            # Data files first: a manifest in the store means its files are there too.
            for name in manifest["files"]:
                store.put_file(prefix + name, Path(tmp) / name)
            store.put_file(prefix + MANIFEST_NAME, Path(tmp) / MANIFEST_NAME)
    except Exception as exc:
        logger.exception("export job %s failed", job_id)
        ExportJob.objects.filter(pk=job_id, status=ExportJob.Status.RUNNING).update(
            status=ExportJob.Status.FAILED, finished_at=timezone.now(), error=f"{type(exc).__name__}: {exc}"
        )
        return ExportJob.objects.filter(pk=job_id).first()
    ExportJob.objects.filter(pk=job_id, status=ExportJob.Status.RUNNING).update(
        status=ExportJob.Status.SUCCEEDED,
        finished_at=timezone.now(),
        object_prefix=prefix,
        manifest=manifest,
        row_count=manifest["row_count"],
    )
    return ExportJob.objects.filter(pk=job_id).first()


def export_job_create(
    *, created_by: User | None, filters: ExportFilters, formats: Sequence[str]
) -> ExportJob:
    """Record an export job and run it on the control queue once the transaction commits."""
    job = ExportJob.objects.create(
        created_by=created_by, filters=filters.pinned().as_json(), formats=export_formats_clean(formats)
    )
    scope = filters.team_scope()
    if scope:
        teams = list(Team.objects.filter(slug__in=scope).values_list("pk", flat=True))
        if len(teams) == len(scope):  # a slug that names no team leaves the job the platform's
            job.teams.set(teams)
    job_id = job.pk
    transaction.on_commit(lambda: task_send(EXPORT_JOB_RUN, job_id, queue=CONTROL_QUEUE))
    return job


def export_jobs_of_teams(jobs: QuerySet[ExportJob], teams: frozenset[int] | None) -> QuerySet[ExportJob]:
    """The jobs a caller scoped to `teams` may see (None: platform-wide, every job): those whose
    teams (ExportJob.teams) are all among `teams`; a job of no team is the platform's only."""
    if teams is None:
        return jobs
    of_job = ExportJob.teams.through.objects.filter(exportjob_id=OuterRef("pk"))
    return jobs.filter(Exists(of_job)).exclude(Exists(of_job.exclude(team_id__in=teams)))


def export_job_file_names(job: ExportJob) -> list[str]:
    """The files a finished job offers for download, manifest first."""
    if job.status != ExportJob.Status.SUCCEEDED:
        return []
    return [MANIFEST_NAME, *sorted(job.manifest.get("files", {}))]


def export_job_file_chunks(*, job: ExportJob, name: str) -> Iterator[bytes]:
    """A finished job's file, read from the object store in chunks (ObjectNotFoundError if gone)."""
    if name not in export_job_file_names(job):
        raise LookupError(f"export #{job.pk} has no file {name!r}")
    return default_store().iter_chunks((job.object_prefix or export_job_prefix(job.pk)) + name)
