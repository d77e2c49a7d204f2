"""bench/gpu_session.sh in DRY_RUN mode: its plumbing (stages, budget, archive) without a GPU,
the sweeps on the sim H200 model and the compile check for sm_90."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "gpu_session.sh"


def test_dry_run_end_to_end(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DRY_RUN": "1",
        "OUT": str(tmp_path / "out"),
        "WORK": str(tmp_path / "work"),
        "STAGES": "compile sweep calibrate",
        "WORKLOADS": "stencil2d transpose",
        "SWEEP_SCALE": "0.05",
        "SWEEP_ITERATIONS": "2",
        "KERNELSTREAM_COMPILE_CACHE": str(tmp_path / "cache"),
    }
    proc = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    log = (tmp_path / "out" / "session.log").read_text()
    assert proc.returncode == 0, log
    assert "compile: exit 0" in log and "sweep stencil2d: exit 0" in log
    assert "sweep transpose: exit 0" in log and "done; results in" in log
    with tarfile.open(tmp_path / "out" / "results.tar.gz") as tar:
        folders = {Path(n).parts[0] for n in tar.getnames()}
        names = {Path(n).name for n in tar.getnames()}
        (check,) = [
            n
            for n in tar.getmembers()
            if n.name.endswith(".json") and "kernels-check-sm_90" in n.name
        ]
        doc = json.load(tar.extractfile(check))  # type: ignore[arg-type]
    assert doc["failed"] == 0 and doc["compiled"] > 0
    (folder,) = folders  # one dated folder that unpacks as is under bench/results/
    assert folder.startswith("gpu-") and folder.endswith("-dry-run-sim-H200")
    assert any(n.startswith("sweep-stencil2d-H200-SXM-141GB-") for n in names)
    assert any(n.startswith("sweep-transpose-H200-SXM-141GB-") for n in names)
    assert any(n.startswith("calibration-") and n.endswith(".txt") for n in names)


def test_without_a_gpu_a_real_run_stops_at_setup(tmp_path: Path) -> None:
    """No nvidia-smi here: the script says so, installs nothing and exits 1."""
    env = {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "WORK": str(tmp_path / "work"),
        "PATH": "/usr/bin:/bin",
    }
    proc = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    log = (tmp_path / "out" / "session.log").read_text()
    assert proc.returncode == 1, log
    assert "no NVIDIA GPU visible" in log
    assert (tmp_path / "out" / "results.tar.gz").is_file()
