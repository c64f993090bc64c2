"""The README is a front page and the docs site holds the rest: the README stays short, every
relative link in the repository's Markdown reaches a file (and a heading, when it names one), and
every environment variable the settings read is on the Configuration page.

`make docs-check` (mkdocs build --strict) checks the links inside docs/ as the site renders them;
these tests also cover README.md, SECURITY.md and the pointer files, which the site does not build.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SKIPPED_DIRS = {
    ".venv",
    ".venv-focus",
    "node_modules",
    "var",
    ".git",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
}

# [text](target) and ![alt](target); a target with a scheme or a leading / is not relative.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def _markdown_files() -> list[Path]:
    return sorted(
        path for path in ROOT.rglob("*.md") if not SKIPPED_DIRS.intersection(path.relative_to(ROOT).parts)
    )


def _relative_links(path: Path) -> list[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", path.read_text()))
    return [
        target
        for target in LINK.findall(text)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("/")
    ]


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub and MkDocs' toc both write it."""
    text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower())
    return re.sub(r" +", "-", text)


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


def test_the_readme_is_a_front_page_of_at_most_200_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the detail into docs/"
    text = "\n".join(lines)
    assert "docs/img/overview.png" in text  # the screenshot tests/ui/test_readme_screenshot.py takes
    assert "make demo" in text and "make test" in text and "make docs" in text


def test_the_markdown_files_are_the_readme_security_the_docs_and_pointers() -> None:
    files = {str(path.relative_to(ROOT)) for path in _markdown_files()}
    assert {"README.md", "SECURITY.md", "docs/index.md", "docs/configuration.md"} <= files
    # The sub-READMEs moved into the site; what is left of them is a pointer, no second copy.
    for pointer in ["inference/README.md", "training/engine/README.md"]:
        assert len((ROOT / pointer).read_text().splitlines()) == 1
        assert _relative_links(ROOT / pointer), pointer


def test_every_relative_link_in_the_markdown_reaches_a_file_and_its_heading() -> None:
    broken = []
    for path in _markdown_files():
        for target in _relative_links(path):
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_a_link_to_a_missing_file_or_heading_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n[ok](#title) [gone](missing.md) `[code](ignored.md)`\n\n```\n[x](no.md)\n```\n"
    )
    assert _relative_links(page) == ["#title", "missing.md"]
    assert _anchors(page) == {"title"}


def test_every_environment_variable_the_settings_read_is_on_the_configuration_page() -> None:
    settings_source = "".join(path.read_text() for path in (ROOT / "stack" / "settings").glob("*.py"))
    names = set(re.findall(r"\benv_[a-z_]+\(\s*\"([A-Z][A-Z0-9_]+)\"", settings_source))
    gunicorn_source = (ROOT / "stack" / "gunicorn_conf.py").read_text()
    names |= set(re.findall(r"environ(?:\.get\(|,)\s*\"([A-Z][A-Z0-9_]+)\"", gunicorn_source))
    assert len(names) > 80  # the pattern still finds the readers
    page = (DOCS / "configuration.md").read_text()
    assert sorted(name for name in names if f"`{name}`" not in page) == []


def test_every_docs_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {path.name for path in DOCS.glob("*.md")}
    assert sorted(page for page in pages if f": {page}" not in nav) == []
