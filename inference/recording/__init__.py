"""Recording routed requests: the request row, its attempts, its hash-chained ledger rows, budget
spend and failover events (see record.inference_request_record for the two ways, and journal
for the durability and exactly-once guarantees of the journaled one)."""

from inference.recording.attempts import UNIT_SUFFIX, AttemptInfo, billable_units, db_text
from inference.recording.journal import (
    journal_fold,
    journal_fold_all,
    journal_folder_stop,
    journal_nudge,
    journal_pending_count,
    journal_status,
)
from inference.recording.record import inference_request_record

__all__ = [
    "UNIT_SUFFIX",
    "AttemptInfo",
    "billable_units",
    "db_text",
    "inference_request_record",
    "journal_fold",
    "journal_fold_all",
    "journal_folder_stop",
    "journal_nudge",
    "journal_pending_count",
    "journal_status",
]
