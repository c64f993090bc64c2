"""Batch inference jobs: the resumable JSONL runner (jobs), its input lines and object keys
(lines), the rate limits a batch line counts against (pacing), and the reads for progress
(selectors)."""
