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

__all__ = ["dated_stem"]


def dated_stem(results_dir: Path, name: str, date: str) -> Path:
    """``name-date`` under ``results_dir``, or ``-runN`` after the highest run already there."""
    results_dir.mkdir(parents=True, exist_ok=True)
    base = f"{name}-{date}"
    run = re.compile(re.escape(base) + r"(?:-run(\d+))?(?=[.-]|$)")
    runs = [int(m.group(1) or 1) for p in results_dir.iterdir() if (m := run.match(p.name))]
    return results_dir / (f"{base}-run{max(runs) + 1}" if runs else base)
