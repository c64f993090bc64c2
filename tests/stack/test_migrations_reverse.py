"""Every migration since stack 0004 can be unapplied and applied again, on a database of its own.

Rolling back to stack 0004 unapplies every later migration of every app that depends on it
(teams, the ledger's triggers, the journal...), each data migration's reverse step included;
the default database refuses every query meanwhile (tests/migration_db.py), so a reverse step
that reads the wrong database fails too."""

from __future__ import annotations

from django.db import connections
from django.db.migrations.executor import MigrationExecutor

from tests.migration_db import migrate_to

BACK_TO = ("stack", "0004_failover_training_inference_fields")


def test_every_migration_since_stack_0004_unapplies_and_applies_again(migrated_scratch_db: str) -> None:
    alias = migrated_scratch_db
    leaves = MigrationExecutor(connections[alias]).loader.graph.leaf_nodes()
    assert MigrationExecutor(connections[alias]).migration_plan(leaves) == []  # at the latest

    backwards = MigrationExecutor(connections[alias]).migration_plan([BACK_TO])
    assert len(backwards) >= 40 and all(undo for _, undo in backwards)
    assert {m.app_label for m, _ in backwards} >= {"stack", "billing", "training", "inference"}
    migrate_to(alias, BACK_TO)
    applied = MigrationExecutor(connections[alias]).loader.applied_migrations
    assert BACK_TO in applied and not any(m.app_label == "stack" and (m.app_label, m.name) in applied
                                          for m, _ in backwards)  # fmt: skip

    migrate_to(alias, *leaves)
    assert MigrationExecutor(connections[alias]).migration_plan(leaves) == []
