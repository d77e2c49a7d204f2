"""Where a benchmark keeps its dated copy: ``<results_dir>/<name>-<date>[-runN]``.

Runs of the same day never overwrite each other: a run after ``-runN`` is ``-run(N+1)``.

>>> import tempfile
>>> d = Path(tempfile.mkdtemp())
>>> dated_stem(d, "pipeline", "2026-11-22").name
'pipeline-2026-11-22'
>>> _ = (d / "pipeline-2026-11-22.json").write_text("{}")
>>> dated_stem(d, "pipeline", "2026-11-22").name
'pipeline-2026-11-22-run2'
>>> _ = (d / "pipeline-2026-11-22-run5-hog.txt").write_text("")
>>> dated_stem(d, "pipeline", "2026-11-22").name
'pipeline-2026-11-22-run6'
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson

__all__ = ["dated_stem", "write_dated"]


def dated_stem(results_dir: Path, name: str, date: str) -> Path:
    """``name-date`` under ``results_dir``, or ``-runN`` after the highest run already there."""
    results_dir.mkdir(parents=True, exist_ok=True)
    base = f"{name}-{date}"
    run = re.compile(re.escape(base) + r"(?:-run(\d+))?(?=[.-]|$)")
    runs = [int(m.group(1) or 1) for p in results_dir.iterdir() if (m := run.match(p.name))]
    return results_dir / (f"{base}-run{max(runs) + 1}" if runs else base)


def write_dated(results_dir: Path, name: str, date: str, report: Any, text: str) -> Path:
    """Write ``report`` (JSON) and ``text`` as the next dated copy of ``name``; the stem."""
    stem = dated_stem(results_dir, name, date)
    Path(f"{stem}.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    Path(f"{stem}.txt").write_text(text + "\n", encoding="utf-8")
    return stem
