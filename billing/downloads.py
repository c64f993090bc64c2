"""Exports as HTTP downloads, for the export pages and the export APIs alike.

Streaming choice: CSV and JSON Lines stream straight from the ledger cursor
(StreamingHttpResponse, constant memory). Parquet writes its footer last, so a
direct Parquet download is written to an anonymous temporary file first and
then streamed from disk (FileResponse); export jobs write all three formats.
"""

from __future__ import annotations

from django.http import FileResponse, HttpResponseBase, StreamingHttpResponse
from django.utils.http import content_disposition_header

from billing.exports import (
    CONTENT_TYPES,
    MANIFEST_NAME,
    ExportFilters,
    export_job_file_chunks,
    export_parquet_tempfile,
    export_stream,
)
from billing.models import ExportJob


def attachment(filename: str) -> str:
    """A Content-Disposition value that downloads as `filename`."""
    return content_disposition_header(True, filename) or "attachment"


def export_response(*, filters: ExportFilters, fmt: str) -> HttpResponseBase:
    """The export as a download: streamed (CSV, JSON Lines) or from a temp file (Parquet)."""
    filename = f"{filters.file_stem()}.{fmt}"
    if fmt == "parquet":
        return FileResponse(
            export_parquet_tempfile(filters=filters),
            as_attachment=True,
            filename=filename,
            content_type=CONTENT_TYPES["parquet"],
        )
    response = StreamingHttpResponse(export_stream(filters=filters, fmt=fmt), content_type=CONTENT_TYPES[fmt])
    response["Content-Disposition"] = attachment(filename)
    return response


def export_job_file_response(*, job: ExportJob, name: str) -> StreamingHttpResponse:
    """One file of a finished export job, streamed from the object store (the job page's link
    and the API's `files[].url` alike). LookupError: not one of the job's files, or gone."""
    chunks = export_job_file_chunks(job=job, name=name)
    fmt = "json" if name == MANIFEST_NAME else job.manifest["files"][name]["format"]
    response = StreamingHttpResponse(chunks, content_type=CONTENT_TYPES[fmt])
    response["Content-Disposition"] = attachment(f"switchyard-export-{job.pk}-{name}")
    return response
