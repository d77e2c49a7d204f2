"""The examples of README.md and of docs/guide/own-kernels.md run as written (side by side).

It is the one run of a ``kernelstream.Node`` given no bootstrap: the node starts the
embedded broker and a worker of its own, writes the kernel's declared space where that
worker reads spaces, and the kernel gets faster than where it started.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelstream.kernels.backends.trace import default_tuning_spaces_dir, is_measured_time

pytestmark = [pytest.mark.integration, pytest.mark.realdata]

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "guide" / "own-kernels.md"
CACHE = default_tuning_spaces_dir() / "convolution_RTX_3090.json.gz"


def _first_python_block(text: str) -> str:
    start = text.index("```python\n") + len("```python\n")
    return text[start : text.index("```", start)]


def _time_of(config_id: str) -> float:
    with gzip.open(CACHE, "rt") as fh:
        doc = json.load(fh)
    config = dict(kv.split("=") for kv in config_id.split(","))
    for r in doc["cache"].values():
        if all(str(r[k]) == v for k, v in config.items()) and is_measured_time(r["time"]):
            return float(r["time"])
    raise AssertionError(f"{config_id} is not a measured configuration")


PAGES = ("docs/guide/own-kernels.md", "README.md")


def test_the_examples_run_as_written(tmp_path: Path) -> None:
    """Both pages' examples, each in its own process with its own broker and worker, run
    side by side: each waits on its windows far more than it computes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELSTREAM_", "KAFKA_"))}
    env["PYTHONPATH"] = str(ROOT)
    runs: dict[str, subprocess.Popen[str]] = {}
    for i, page in enumerate(PAGES):
        code = _first_python_block((ROOT / page).read_text(encoding="utf-8"))
        assert len(code.splitlines()) <= 25, f"{page} promises a short example"
        here = tmp_path / str(i)
        here.mkdir()
        (here / "example.py").write_text(code, encoding="utf-8")
        (here / CACHE.name).symlink_to(CACHE)
        runs[page] = subprocess.Popen(
            [sys.executable, str(here / "example.py")],
            # the guide names the cache file beside the script; the README, from the checkout
            cwd=here if page.startswith("docs") else ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        outs = {page: proc.communicate(timeout=240) for page, proc in runs.items()}
    finally:
        for proc in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for page, (stdout, stderr) in outs.items():
        assert runs[page].returncode == 0, (page, stderr[-3000:])
        lines = [ln.split()[-1] for ln in stdout.splitlines() if ln.startswith(("starting", "now"))]
        assert len(lines) == 2, (page, stdout)
        start, end = (_time_of(c) for c in lines)
        assert end < start / 3, (page, lines, start, end)
