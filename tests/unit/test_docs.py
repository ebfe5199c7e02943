"""The front door and the documentation site: a README of one page, every docs/ page in the
site's navigation, and the module map of docs/architecture.md as the docstrings say it."""

from __future__ import annotations

import re
import subprocess
import sys

import yaml

from tests.conftest import REPO


def test_the_readme_is_one_page_that_links_what_it_leaves_out() -> None:
    readme = (REPO / "README.md").read_bytes()
    assert len(readme) <= 10 * 1024, f"README.md is {len(readme)} bytes: move detail to docs/"
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)", readme.decode()))
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")} - {"docs/index.md"}
    assert pages <= linked, sorted(pages - linked)


def test_every_page_is_in_the_sites_navigation() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    listed = {page for entry in config["nav"] for page in entry.values()}
    assert listed == {p.name for p in (REPO / "docs").glob("*.md")}


def test_the_module_map_is_what_the_docstrings_say() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "module-map"), "--check"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_the_results_table_links_every_benchmarks_history() -> None:
    table = (REPO / "bench" / "RESULTS.md").read_text()
    linked = set(re.findall(r"\]\(results/([\w-]+\.md)\)", table))
    assert linked == {p.name for p in (REPO / "bench" / "results").glob("*.md")}
