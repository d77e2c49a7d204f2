"""README.md stays a landing page that matches the code: short, every command listed, links alive.

The commands its code blocks show are run by ``tests/integration/test_newcomer.py``; the
docs site's own links are checked by ``mkdocs build --strict`` in CI.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelstream.app.cli.main import main as cli

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _table_commands() -> list[str]:
    section = README.split("## Commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `kernelstream (\S+)`", section, flags=re.M)


def test_readme_is_short() -> None:
    assert len(README.splitlines()) <= 200


def test_command_table_lists_every_command_once() -> None:
    listed = _table_commands()
    assert sorted(listed) == sorted(cli.commands), "README's command table vs the CLI"
    assert len(listed) == len(set(listed))


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_every_listed_command_has_help(command: str) -> None:
    result = CliRunner().invoke(cli, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_readme_links_point_at_files() -> None:
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert targets
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert not missing, missing


def test_readme_keeps_no_development_history() -> None:
    """Run numbers, sessions and dated rounds belong in docs/history/, not on the front door."""
    for pattern in (r"\brun\d+\b", r"(?<![-_])\bsession\b", r"\bissue\b", r"\b20\d\d-\d\d-\d\d\b"):
        assert not re.search(pattern, README, flags=re.I), pattern
