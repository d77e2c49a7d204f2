"""Every .cu compiles with nvcc for sm_80 and sm_90, at its default and at another config."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kernelstream.kernels import WORKLOAD_NAMES, get_workload


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    fallback = Path("/usr/local/cuda/bin/nvcc")
    return str(fallback) if fallback.is_file() else None


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_cu_compiles(name: str, arch: str, tmp_path: Path) -> None:
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not on PATH nor in /usr/local/cuda/bin")
    w = get_workload(name)
    configs = list(w.space)
    other = configs[len(configs) * 2 // 3]
    for i, config in enumerate((w.default, other)):
        defines = [f"-D{k}={v}" for k, v in w.defines(config).items()]
        out = tmp_path / f"{name}{i}.o"
        cmd = [nvcc, "-c", f"-arch={arch}", "-std=c++14", *defines, str(w.source), "-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
