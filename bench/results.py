"""Where a benchmark keeps its dated copy: ``<results_dir>/<name>-<date>[-runN]``.

Runs of the same day never overwrite each other: the second is ``-run2``, and so on.

>>> import tempfile
>>> d = Path(tempfile.mkdtemp())
>>> dated_stem(d, "pipeline", "2026-11-22").name
'pipeline-2026-11-22'
>>> _ = (d / "pipeline-2026-11-22.json").write_text("{}")
>>> dated_stem(d, "pipeline", "2026-11-22").name
'pipeline-2026-11-22-run2'
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["dated_stem"]


def dated_stem(results_dir: Path, name: str, date: str) -> Path:
    """The first ``name-date[-runN]`` under ``results_dir`` that no file starts with yet."""
    results_dir.mkdir(parents=True, exist_ok=True)
    taken = {p.name for p in results_dir.iterdir()}
    n = 1
    while True:
        stem = f"{name}-{date}" if n == 1 else f"{name}-{date}-run{n}"
        if not any(t == stem or t.startswith(stem + ".") for t in taken):
            return results_dir / stem
        n += 1
