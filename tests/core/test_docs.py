"""The documents a user reads: the README within 250 lines with its two quick-start commands, the
model contract in step with the shared one, and no text that cites development sessions (what was
measured belongs in the text; how it came about, in the commit messages)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEXT = (".py", ".md", ".cu", ".cuh", ".sh", ".toml", ".txt", ".cfg")
SKIP = {".git", ".venv", "build", "dist", "__pycache__", ".pytest_cache", ".whl", ".device", ".data", "out"}


def test_readme_is_short_and_has_the_quick_start():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; details belong in docs/"
    for marker in ("<!-- quickstart-sample -->", "<!-- quickstart-test -->"):
        assert marker in lines, marker


def test_model_spec_is_the_shared_contract():
    shared = ROOT.parent / "shared" / "docs" / "model-spec.md"
    if not shared.is_file():
        pytest.skip("no shared docs beside this checkout")
    assert (ROOT / "docs" / "model-spec.md").read_text() == shared.read_text(), \
        "docs/model-spec.md differs from the shared contract: copy it over"


def test_no_text_cites_development_sessions():
    cites = re.compile(r"\bsessions? \d+|perf-notes\.md|perf-history\.md", re.IGNORECASE)
    found = []
    for path in ROOT.rglob("*"):
        if SKIP & set(path.relative_to(ROOT).parts) or not path.is_file() or path.suffix not in TEXT:
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if cites.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, found[:10]
