"""Reading a text dataset by position: one object from any document start (``records``), and
the dataset's split into shards by bytes or rows, recorded once per run (``manifest``)."""

from training.engine.shards.manifest import DatasetManifest, build_manifest, range_documents, run_manifest
from training.engine.shards.records import (
    TEXT_PIECE_BYTES,
    Cursor,
    DatasetError,
    Document,
    Format,
    TextDataset,
    file_documents,
)

__all__ = [
    "TEXT_PIECE_BYTES",
    "Cursor",
    "DatasetError",
    "DatasetManifest",
    "Document",
    "Format",
    "TextDataset",
    "build_manifest",
    "file_documents",
    "range_documents",
    "run_manifest",
]
