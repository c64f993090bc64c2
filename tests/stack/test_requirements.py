"""Runtime apart from tooling: the Docker image installs the runtime lock and nothing else, that lock
holds no test or dev tool, and the dev lock adds tools on top without moving a runtime pin.

requirements.in -> requirements.txt (runtime: the Dockerfile, `make install`, `make demo`);
requirements-dev.in -> requirements-dev.txt (what `make test` adds). `make lock` compiles both.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.metadata
import shlex
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_LOCK = ROOT / "requirements.txt"
DEV_LOCK = ROOT / "requirements-dev.txt"
APP_PACKAGES = ("stack", "bench", "registry", "billing", "training", "inference", "decisions", "storage")

# Test runners, browsers, fakes, linters, type checkers and stubs, the docs builder: none of them
# belongs in the image (canonical names; shell-style patterns).
DEV_TOOLS = (
    "pytest",
    "pytest-*",
    "playwright",
    "moto",
    "schemathesis",
    "hypothesis",
    "hypothesis-*",
    "time-machine",
    "ruff",
    "mypy",
    "import-linter",
    "grimp",
    "*-stubs",
    "types-*",
    "celery-types",
    "openai",
    "mkdocs",
    "mkdocs-*",
)


def _requirements(path: Path) -> list[Requirement]:
    """The requirement lines of a pip requirements file; -r/-c and other options are skipped."""
    found = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        found.append(Requirement(line))
    return found


def _pins(path: Path) -> dict[str, str]:
    """A lock as {canonical name: version}; every line must be an exact `==` pin."""
    pins: dict[str, str] = {}
    for requirement in _requirements(path):
        specifiers = list(requirement.specifier)
        assert len(specifiers) == 1 and specifiers[0].operator == "==", (
            f"{path.name}: {requirement} is not pinned with =="
        )
        name = canonicalize_name(requirement.name)
        assert name not in pins, f"{path.name} pins {name} twice"
        pins[name] = specifiers[0].version
    return pins


def _dockerfile_installs() -> tuple[list[str], list[str]]:
    """(requirement files, bare package arguments) of every `pip install` in the Dockerfile."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    files: list[str] = []
    packages: list[str] = []
    takes_value = {"-r", "--requirement", "-c", "--constraint", "-i", "--index-url", "--extra-index-url"}
    takes_value |= {"-f", "--find-links", "--target", "-t", "--prefix", "--root"}
    for line in text.splitlines():
        if not line.startswith("RUN "):
            continue
        for command in line[len("RUN ") :].split("&&"):
            argv = shlex.split(command)
            if "pip" not in argv[:4] or "install" not in argv:
                continue
            args = iter(argv[argv.index("install") + 1 :])
            for arg in args:
                if arg in ("-r", "--requirement"):
                    files.append(next(args))
                elif arg in takes_value:
                    next(args)
                elif not arg.startswith("-"):
                    packages.append(arg)
    return files, packages


def _dev_tools_in(names: set[str]) -> list[str]:
    return sorted(name for name in names if any(fnmatch.fnmatchcase(name, pattern) for pattern in DEV_TOOLS))


def test_the_docker_image_installs_the_runtime_lock_and_nothing_else() -> None:
    files, packages = _dockerfile_installs()
    assert files == ["requirements.txt"], files
    assert packages == [], f"the Dockerfile installs packages outside the lock: {packages}"


def test_the_runtime_lock_holds_no_test_or_dev_tool() -> None:
    files, _ = _dockerfile_installs()
    for name in files:
        pins = _pins(ROOT / name)
        assert _dev_tools_in(set(pins)) == [], f"{name} (the Docker image's set) carries dev tools"
        assert (
            _dev_tools_in({canonicalize_name(r.name) for r in _requirements(ROOT / "requirements.in")}) == []
        )


def test_the_dev_tools_are_in_the_dev_lock() -> None:
    dev = _pins(DEV_LOCK)
    for tool in ("pytest", "pytest-django", "pytest-xdist", "playwright", "moto", "schemathesis", "ruff"):
        assert tool in dev, f"requirements-dev.txt lacks {tool}"
    for tool in ("mypy", "import-linter", "time-machine", "mkdocs", "mkdocs-material", "openai"):
        assert tool in dev, f"requirements-dev.txt lacks {tool}"


def test_every_direct_requirement_is_pinned_in_its_lock_within_its_range() -> None:
    for source, lock in (("requirements.in", RUNTIME_LOCK), ("requirements-dev.in", DEV_LOCK)):
        pins = _pins(lock)
        for requirement in _requirements(ROOT / source):
            name = canonicalize_name(requirement.name)
            assert name in pins, f"{source} names {requirement} but {lock.name} does not pin it"
            assert requirement.specifier.contains(pins[name], prereleases=True), (
                f"{lock.name} pins {name}=={pins[name]}, outside {source}'s {requirement}"
            )


def test_the_dev_lock_keeps_every_runtime_pin() -> None:
    runtime, dev = _pins(RUNTIME_LOCK), _pins(DEV_LOCK)
    moved = {name: (version, dev.get(name)) for name, version in runtime.items() if dev.get(name) != version}
    assert moved == {}, f"requirements-dev.txt moves or drops runtime pins (runtime, dev): {moved}"


def test_the_locks_name_no_index_so_each_machine_keeps_its_own() -> None:
    # The Dockerfile adds PyTorch's CPU index itself; a GPU image drops it (see the Dockerfile).
    for lock in (RUNTIME_LOCK, DEV_LOCK):
        options = [line for line in lock.read_text().splitlines() if line.startswith("-")]
        assert options == [], f"{lock.name}: {options}"
        assert "+" not in "".join(_pins(lock).values()), f"{lock.name} pins a local build label"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST) -> set[str]:
    """Top-level module names imported anywhere in a module (lazy imports too), except under
    `if TYPE_CHECKING:`, which never runs."""
    found: set[str] = set()
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        pending.extend(ast.iter_child_nodes(node))
    return found


def test_the_app_imports_nothing_outside_the_runtime_lock() -> None:
    """A runtime import of a package only the dev lock brings (pytest, moto, openai, ...) would work
    under `make test` and fail in the image: every third-party module the apps import must come from
    a distribution the runtime lock pins."""
    runtime = set(_pins(RUNTIME_LOCK))
    providers = importlib.metadata.packages_distributions()
    stdlib = set(sys.stdlib_module_names)
    missing: dict[str, list[str]] = {}
    for package in APP_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for module in _runtime_imports(ast.parse(path.read_text(), filename=str(path))):
                if module in stdlib or module in APP_PACKAGES or module == "__future__":
                    continue
                dists = {canonicalize_name(dist) for dist in providers.get(module, [])}
                if not dists & runtime:
                    missing.setdefault(
                        f"{module} ({', '.join(sorted(dists)) or 'not installed'})", []
                    ).append(str(path.relative_to(ROOT)))
    assert missing == {}, f"imported by the apps but not in requirements.txt: {missing}"


def test_the_image_copies_no_virtualenv_or_tests() -> None:
    # `COPY . .` would otherwise carry a local .venv (with every dev tool) and the test suite.
    ignored = {
        line.strip().strip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for path in (
        ".venv",
        ".venv-focus",
        "tests",
        "requirements-dev.txt",
        "requirements-dev.in",
        "var",
        ".git",
    ):
        assert path in ignored, f".dockerignore does not keep {path} out of the image"
