"""Every docstring example in the package runs, so an example cannot drift from the code."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _modules_with_examples() -> list[str]:
    names = []
    for folder in ("app", "agents", "kernels", "schemas"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if ">>>" in path.read_text():
                rel = path.relative_to(ROOT).with_suffix("")
                parts = [p for p in rel.parts if p != "__init__"]
                names.append("kernelstream." + ".".join(parts))
    return names


MODULES = _modules_with_examples()


def test_examples_are_found() -> None:
    assert MODULES, "no docstring examples found: the search is broken"


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=FLAGS, report=True)
    assert result.failed == 0
