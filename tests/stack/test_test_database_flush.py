"""The suite's faster end for transactional tests (tests/fast_flush.py) empties what Django's flush
empties, every table a test wrote, the append-only ledger and audit trail included, and puts back
what the migrations wrote (the roles' groups, the ledger's head), while the content types and
permissions that migrate made stay as post_migrate would make them again."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.utils import timezone

from billing.models import LedgerHead, Unit, UsageRecord
from billing.services import usage_record
from registry.audit.models import AuditEntry
from registry.auth.roles import Role
from registry.models import Cluster, Provider
from tests import fast_flush
from tests.factories import make_cluster, make_user

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_it_empties_every_written_table_even_the_append_only_ones_and_keeps_content_types() -> None:
    assert fast_flush.installed()  # pytest-django's transactional tests use it
    content_types, permissions = ContentType.objects.count(), Permission.objects.count()
    groups = set(Group.objects.values_list("name", flat=True))
    heads = list(LedgerHead.objects.values_list("partition", "last_sequence"))
    assert groups >= {role.value for role in Role} and heads == [("main", 0)]
    make_user(Role.OPERATOR, username="flushed")
    cluster = make_cluster(slug="flushed-cluster")
    usage_record(
        unit=Unit.ACCELERATOR_HOUR,
        quantity=Decimal("1"),
        occurred_at=timezone.now(),
        idempotency_key="flush:1",
        subject_type="probe_job",
        subject_id="1",
        cluster=cluster,
    )
    assert UsageRecord.objects.count() == 1 and AuditEntry.objects.exists()

    emptied = fast_flush.flush_written_tables(connection.alias)

    assert {"auth_user", Cluster._meta.db_table, Provider._meta.db_table, UsageRecord._meta.db_table} <= set(
        emptied
    )
    assert AuditEntry._meta.db_table in emptied
    tables = set(connection.introspection.django_table_names(only_existing=True, include_views=False))
    quote = connection.ops.quote_name
    holding = []
    with connection.cursor() as cursor:
        for table in sorted(tables - fast_flush.KEPT):
            cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {quote(table)})")  # noqa: S608
            if cursor.fetchone()[0]:
                holding.append(table)
    # Only what the migrations wrote is back, as it was: the roles' groups and the ledger's head.
    assert holding == sorted(fast_flush.seeded_tables(connection.alias))
    assert {"auth_group", LedgerHead._meta.db_table} <= set(holding)
    assert set(Group.objects.values_list("name", flat=True)) == groups
    assert list(LedgerHead.objects.values_list("partition", "last_sequence")) == heads
    assert (ContentType.objects.count(), Permission.objects.count()) == (content_types, permissions)
    # The triggers (foreign keys, append-only tables) stood aside for the flush's transaction only.
    with connection.cursor() as cursor:
        cursor.execute("SHOW session_replication_role")
        assert cursor.fetchone()[0] == "origin"
