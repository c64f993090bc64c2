"""The layering is written as import-linter contracts (pyproject.toml) and checked by `make lint`.

These tests prove the contracts bite: a copy of the tree with one forbidden import fails
`lint-imports` naming the broken contract. The contracts name whole packages, so a new module is
covered without a list to keep up to date.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("stack", "bench", "registry", "billing", "training", "inference", "decisions", "storage")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _contracts() -> dict[str, dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tree, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    """The project's packages and pyproject.toml, copied so a test may break them."""
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_contracts_hold_on_the_tree_as_it_is(tree_copy: Path) -> None:
    result = _lint(tree_copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(_contracts())} kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract_id"),
    [
        ("billing/models/ledger.py", "import inference.models", "layers"),
        ("registry/models/providers.py", "import billing.models", "layers"),
        ("registry/audit/models.py", "import decisions.models", "layers"),
        ("training/engine/model.py", "import django.conf", "pure-engine"),
        ("training/engine/syncer.py", "import training.services", "pure-engine"),
        ("inference/router/entry.py", "import training.services", "layers"),
        ("training/models.py", "import stack.urls", "layers"),
        ("decisions/models/replay.py", "import stack.views", "layers"),
        ("inference/models.py", "import bench.mockprovider", "layers"),
        ("storage/objectstore.py", "import registry.models", "pure-storage"),
        ("inference/router/policy.py", "import inference.models", "pure-routing"),
    ],
)
def test_a_forbidden_import_fails_lint_naming_the_contract(
    tree_copy: Path, module: str, line: str, contract_id: str
) -> None:
    path = tree_copy / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    result = _lint(tree_copy)
    assert result.returncode != 0
    report = " ".join(result.stdout.split())  # undo the report's line wrapping
    assert f"{_contracts()[contract_id]['name']} BROKEN" in report, result.stdout
