"""Every data migration reads and writes the database being migrated (`manage.py migrate
--database`, a test's scratch database), never the default connection by accident."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS = sorted(
    path
    for top in ROOT.iterdir()
    if top.is_dir() and not top.name.startswith((".", "tests", "var"))
    for path in top.glob("**/migrations/0*.py")
)


def _managers_without_using(source: str) -> list[int]:
    """Line numbers of `<model>.objects` not followed by `.using(...)`."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "objects":
            parent = parents.get(node)
            if not (isinstance(parent, ast.Attribute) and parent.attr == "using"):
                lines.append(node.lineno)
    return lines


def test_the_check_finds_a_manager_on_the_default_database() -> None:
    assert _managers_without_using("Team.objects.filter(slug='a')\nTeam.objects.using(db).all()\n") == [1]


def test_every_data_migration_names_its_database() -> None:
    assert len(MIGRATIONS) > 30  # the glob found the apps' migrations
    wrong = {
        str(path.relative_to(ROOT)): lines
        for path in MIGRATIONS
        if (lines := _managers_without_using(path.read_text()))
    }
    assert wrong == {}, "use Model.objects.using(schema_editor.connection.alias) in RunPython steps"
