"""The examples of README.md and of docs/guide/own-kernels.md run as written.

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


@pytest.mark.parametrize("page", ["docs/guide/own-kernels.md", "README.md"])
def test_the_example_runs_as_written(page: str, tmp_path: Path) -> None:
    code = _first_python_block((ROOT / page).read_text(encoding="utf-8"))
    assert len(code.splitlines()) <= 25, "the page promises a short example"
    (tmp_path / "example.py").write_text(code, encoding="utf-8")
    (tmp_path / CACHE.name).symlink_to(CACHE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELSTREAM_", "KAFKA_"))}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, str(tmp_path / "example.py")],
        # the guide names the cache file beside the script; the README, from the checkout
        cwd=tmp_path if page.startswith("docs") else ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [ln.split()[-1] for ln in out.stdout.splitlines() if ln.startswith(("starting", "now"))]
    assert len(lines) == 2, out.stdout
    start, end = (_time_of(c) for c in lines)
    assert end < start / 3, (lines, start, end)
