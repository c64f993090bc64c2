"""The pieces of tests/stack/test_api_fuzz.py: its options, the seeded world and the config that
names it, the Schemathesis process, and which operations each shard fuzzes (hooks.py is loaded
by the Schemathesis process itself)."""

from tests.stack.api_fuzz.options import EXAMPLES, deep, examples
from tests.stack.api_fuzz.runner import FuzzResult, FuzzRun, finish, phases, start
from tests.stack.api_fuzz.scope import SHARDS, operations_for, shard_filters
from tests.stack.api_fuzz.world import World, schemathesis_config, seed_world

__all__ = [
    "EXAMPLES",
    "SHARDS",
    "FuzzResult",
    "FuzzRun",
    "World",
    "deep",
    "examples",
    "finish",
    "operations_for",
    "phases",
    "schemathesis_config",
    "seed_world",
    "shard_filters",
    "start",
]
