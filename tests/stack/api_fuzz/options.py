"""The fuzz run's fixed options: seed, examples per operation, checks left out, time limits."""

from __future__ import annotations

import os
from pathlib import Path

HOOKS = Path(__file__).with_name("hooks.py")
SEED = 20260512
EXAMPLES = 10  # per operation and phase; API_FUZZ_DEEP raises it
DEEP_EXAMPLES = 50
EXCLUDED_CHECKS = (
    "negative_data_rejection",
    "positive_data_acceptance",
    "use_after_free",
    "ensure_resource_availability",
)
# `--checks all` includes a response-time limit (10 s unless set). A wall clock is no behaviour:
# on a shared 2-core machine running the suite in parallel a 403 once took 26 s. The limit is set
# to the request timeout, so only a request that times out fails; speed is the benchmarks'.
RESPONSE_SECONDS = 60


def deep() -> bool:
    return os.environ.get("API_FUZZ_DEEP", "").strip() not in ("", "0")


def examples() -> int:
    if not deep():
        return EXAMPLES
    asked = os.environ["API_FUZZ_DEEP"].strip()
    return int(asked) if asked.isdigit() and int(asked) > 1 else DEEP_EXAMPLES
