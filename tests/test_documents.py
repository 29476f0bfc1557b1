"""The repository's text describes the product as it is: the word for a period of work appears only inside
library names, code cites no numbered section of a results page, the README stays short, and every link
between the documents reaches a file. Read from the files git tracks (skipped outside a git checkout)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT = {".py", ".md", ".toml", ".txt", ".yml", ".yaml", ".cfg", ".ini", ".sh"}
# spelt in two parts so that this file passes its own check
WORD = re.compile("sess" "ion", re.IGNORECASE)
LIBRARY_NAMES = re.compile("|".join(map(re.escape, [
    "InferenceSession", "SessionOptions",  # onnxruntime
    'scope="session"',  # pytest's fixture scope
    "start_new_session",  # subprocess
    "session_hash", "session_data", "state_session_capacity",  # gradio
    "requests.Session",
])))
SECTION_CITE = re.compile(r"sections? \d")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = [ROOT / name for name in out.splitlines()]
    return [f for f in files if f.is_file() and (f.suffix in TEXT or f.name == "Makefile")]


def test_the_word_appears_only_in_library_names():
    found = []
    for f in tracked_files():
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            if WORD.search(LIBRARY_NAMES.sub("", line)):
                found.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found)


def test_code_cites_no_numbered_section_of_a_document():
    found = [f"{f.relative_to(ROOT)}:{n}" for f in tracked_files() if f.suffix == ".py"
             for n, line in enumerate(f.read_text().splitlines(), 1) if SECTION_CITE.search(line)]
    assert not found, found


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 220


def test_every_link_between_documents_reaches_a_file():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]  # docs/results/ too
    broken = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert pages[1:], "no docs/*.md found"
    assert not broken, broken


def test_every_results_page_is_listed_in_the_results_index():
    """docs/results/ holds the measured figures; its README.md lists each page, so none is found only by chance."""
    results = ROOT / "docs" / "results"
    listed = set(LINK.findall((results / "README.md").read_text()))
    pages = {f.name for f in results.glob("*.md")} - {"README.md"}
    assert pages, "no docs/results/*.md found"
    assert not pages - listed, sorted(pages - listed)


def test_every_test_docs_claims_names_exists():
    """docs/claims.md backs each promise with a test; a renamed or deleted test must not leave a row that
    points at nothing."""
    import ast

    named = re.findall(r"(tests/[\w/]+\.py)::(test_\w+)", (ROOT / "docs" / "claims.md").read_text())
    assert len(named) >= 40, "docs/claims.md names fewer tests than it did"
    missing, defined = [], {}
    for path, name in named:
        if path not in defined:
            f = ROOT / path
            tree = ast.parse(f.read_text()) if f.is_file() else ast.Module(body=[], type_ignores=[])
            defined[path] = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if name not in defined[path]:
            missing.append(f"{path}::{name}")
    assert not missing, missing


DOC_PATH = re.compile(r"\bdocs/[\w/-]+\.md\b")


def test_every_docs_page_the_code_names_exists():
    """A help text, error or docstring that sends a reader to docs/X.md names a page that is there."""
    sources = [*ROOT.glob("vqa/**/*.py"), *ROOT.glob("scripts/*.py"), ROOT / "app.py", ROOT / "Makefile"]
    missing = sorted(f"{p.relative_to(ROOT)}: {m}" for p in sources for m in DOC_PATH.findall(p.read_text())
                     if not (ROOT / m).is_file())
    assert not missing, missing
