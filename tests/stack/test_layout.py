"""The folders keep the shape docs/code-layout.md describes, and the moves that made it left the
database as it was.

- Every app keeps the label its tables, migrations and django_migrations rows were written under
  (the registry moved from stack.registry to registry, decisions and the audit trail too): an
  existing database migrates with nothing to do, and the models match the migrations on disk
  (what `makemigrations --check` asks, without a database).
- No package holds more than 20 modules of its own, and no module reaches 500 lines: a family
  that grows becomes a package (migrations and tests are not counted).
"""

from __future__ import annotations

from pathlib import Path

from django.apps import apps
from django.db.migrations.autodetector import MigrationAutodetector
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.questioner import NonInteractiveMigrationQuestioner
from django.db.migrations.state import ProjectState

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("stack", "bench", "registry", "billing", "training", "inference", "decisions", "storage")
MAX_MODULES = 20
MAX_LINES = 500

# app label -> the package that holds it; the labels are the ones the existing databases know.
LABELS = {
    "stack": "registry",
    "audit": "registry.audit",
    "decisions": "decisions",
    "billing": "billing",
    "training": "training",
    "inference": "inference",
    "switchyard": "stack",
}


def _packages() -> list[Path]:
    return sorted(
        path.parent
        for name in PACKAGES
        for path in (ROOT / name).rglob("__init__.py")
        if "migrations" not in path.parts and "__pycache__" not in path.parts
    )


def test_every_app_keeps_the_label_its_tables_and_migrations_were_written_under() -> None:
    ours = {config.label: config.name for config in apps.get_app_configs() if config.label in LABELS}
    assert ours == LABELS


def test_every_migration_on_disk_belongs_to_an_installed_app() -> None:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    labels = {config.label for config in apps.get_app_configs()}
    assert {label for label, _ in loader.disk_migrations} <= labels
    assert {label for label, _ in loader.disk_migrations} >= set(LABELS) - {"switchyard"}


def test_the_models_match_the_migrations_so_nothing_new_would_be_written() -> None:
    loader = MigrationLoader(None, ignore_no_migrations=True)
    autodetector = MigrationAutodetector(
        loader.project_state(),
        ProjectState.from_apps(apps),
        NonInteractiveMigrationQuestioner(specified_apps=None, dry_run=True),
    )
    changes = autodetector.changes(graph=loader.graph)
    assert changes == {}, {label: [m.name for m in migrations] for label, migrations in changes.items()}


def test_no_package_holds_more_than_20_modules_of_its_own() -> None:
    crowded = {
        str(package.relative_to(ROOT)): count
        for package in _packages()
        if (count := len(list(package.glob("*.py")))) > MAX_MODULES
    }
    assert crowded == {}


def test_no_module_reaches_500_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for package in _packages()
        for path in package.glob("*.py")
        if (lines := len(path.read_text().splitlines())) >= MAX_LINES
    }
    assert long == {}
