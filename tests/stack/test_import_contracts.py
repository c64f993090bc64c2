"""The layering is written as import-linter contracts (pyproject.toml) and checked by `make lint`.

These tests prove the contracts bite: a copy of the tree with one forbidden import fails
`lint-imports` naming the broken contract, and the lists of modules in the contracts cover every
module that exists, so a new composition or training module cannot slip past them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("stack", "billing", "training", "inference", "storage")
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
        ("billing/models.py", "import inference.models", "billing"),
        ("stack/registry/models.py", "import billing.models", "registry"),
        ("training/engine/model.py", "import django.conf", "pure-engine"),
        ("training/engine/syncer.py", "import training.services", "pure-engine"),
        ("inference/router/entry.py", "import training.services", "inference"),
        ("training/models.py", "import stack.urls", "training"),
        ("storage/objectstore.py", "import stack.registry.models", "pure-storage"),
        ("inference/routing.py", "import inference.models", "pure-routing"),
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


def _top_modules(package: Path) -> set[str]:
    names = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    return names


def test_every_composition_module_is_named_in_the_contracts_below_it() -> None:
    composition = {f"stack.{name}" for name in _top_modules(ROOT / "stack") - {"registry"}}
    for contract_id in ("registry", "billing", "training", "inference"):
        forbidden = set(_contracts()[contract_id]["forbidden_modules"])  # type: ignore[arg-type]
        assert composition <= forbidden, (contract_id, sorted(composition - forbidden))


def test_the_engine_contract_names_every_other_training_module() -> None:
    others = {f"training.{name}" for name in _top_modules(ROOT / "training") - {"engine", "migrations"}}
    forbidden = set(_contracts()["pure-engine"]["forbidden_modules"])  # type: ignore[arg-type]
    assert others <= forbidden, sorted(others - forbidden)


def test_the_routing_core_contract_names_every_other_inference_module() -> None:
    others = {f"inference.{name}" for name in _top_modules(ROOT / "inference") - {"routing", "migrations"}}
    forbidden = set(_contracts()["pure-routing"]["forbidden_modules"])  # type: ignore[arg-type]
    assert others <= forbidden, sorted(others - forbidden)
