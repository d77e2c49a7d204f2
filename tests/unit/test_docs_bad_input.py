"""docs/reliability/bad-input.md shows the bad-input catalogue the tests run."""

from __future__ import annotations

from pathlib import Path

from tests.bad_input import markdown_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability" / "bad-input.md"


def test_the_table_is_the_catalogue() -> None:
    assert markdown_table() in DOC.read_text(), "regenerate: python -m tests.bad_input"


def test_at_least_thirty_classes_with_their_outcome() -> None:
    rows = [line for line in markdown_table().splitlines() if line.startswith("| ") and "`" in line]
    assert len(rows) >= 30
