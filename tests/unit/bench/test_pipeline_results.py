"""Where ``bench pipeline`` writes a run: the next dated copy, and ``--json`` once."""

from __future__ import annotations

from pathlib import Path

from kernelstream.bench.pipeline import write_results


def test_json_naming_the_next_dated_copy_is_that_copy(tmp_path: Path) -> None:
    stem = write_results(
        tmp_path,
        "pipeline",
        "2026-11-25",
        '{"a": 1}',
        "table",
        tmp_path / "pipeline-2026-11-25.json",
    )
    assert stem == tmp_path / "pipeline-2026-11-25"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "pipeline-2026-11-25.json",
        "pipeline-2026-11-25.txt",
    ]
    # the next run of the day, its --json elsewhere: a run2 copy and that file
    elsewhere = tmp_path / "out" / "x.json"
    stem = write_results(tmp_path, "pipeline", "2026-11-25", '{"a": 2}', "t2", elsewhere)
    assert stem == tmp_path / "pipeline-2026-11-25-run2"
    assert elsewhere.read_text() == '{"a": 2}' == Path(f"{stem}.json").read_text()
    assert Path(f"{stem}.txt").read_text() == "t2\n"
    assert (tmp_path / "pipeline-2026-11-25.json").read_text() == '{"a": 1}'
