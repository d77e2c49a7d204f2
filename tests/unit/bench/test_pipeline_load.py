"""``bench pipeline --latency-load``: the fractions of capacity it accepts."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelstream.bench.pipeline import command
from kernelstream.bench.pipeline_load import parse_loads


def test_fractions_are_parsed_in_order() -> None:
    assert parse_loads("0.1,0.5, 0.9") == [0.1, 0.5, 0.9]
    assert parse_loads(None) == [] and parse_loads("") == []


@pytest.mark.parametrize("bad", ["0", "-0.5", "2", "half", "0.1,,0.9"])
def test_a_bad_fraction_is_refused_with_a_one_line_reason(bad: str) -> None:
    with pytest.raises(ValueError, match="--latency-load"):
        parse_loads(bad)


def test_the_command_refuses_a_bad_fraction_before_starting_a_broker(tmp_path: Path) -> None:
    out = CliRunner().invoke(
        command, ["--json", str(tmp_path / "r.json"), "--latency-load", "0.5,9"]
    )
    assert out.exit_code == 2
    assert "9.0 is not a fraction of capacity" in out.output
