"""The docs stay enterable: a short README whose links land on files (CI runs its test
command), an architecture page one reads in a sitting, and every docs page in the site's
navigation (mkdocs build --strict, run by CI, checks the links inside the site)."""
from __future__ import annotations

import re
from pathlib import Path

from tests.paths import ROOT

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def local_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(path.read_text()) if "://" not in t]


def test_the_readme_is_short_and_its_links_land_on_files():
    readme = ROOT / "README.md"
    assert len(readme.read_bytes()) <= 12 * 1024
    assert "python -m pytest -q\n" in readme.read_text()  # CI runs the README's test command
    links = local_links(readme)
    assert any(t.startswith("docs/") for t in links)
    assert [t for t in links if not (ROOT / t).exists()] == []


def test_the_architecture_page_fits_a_sitting():
    assert len((ROOT / "docs" / "architecture.md").read_bytes()) <= 10 * 1024


def test_every_docs_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert pages and [p for p in pages if f": {p}" not in nav] == []
