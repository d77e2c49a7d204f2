"""The installed distribution has one top-level import package, ``kernelstream``."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kernelstream.schemas import native

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("app", "agents", "kernels", "schemas", "bench")


def test_every_design_folder_is_mapped_under_the_namespace() -> None:
    for name in FOLDERS:
        link = ROOT / "kernelstream" / name
        assert link.is_symlink(), f"kernelstream/{name} must be a symlink to ../{name}"
        assert link.resolve() == (ROOT / name).resolve()


def _bare_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [n for n in names if n.split(".")[0] in FOLDERS]
    return found


def test_no_module_imports_a_bare_top_level_name() -> None:
    """``import app.x`` would load a second copy of a module beside ``kernelstream.app.x``."""
    offenders = {}
    for folder in (*FOLDERS, "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if bad := _bare_imports(path):
                offenders[str(path.relative_to(ROOT))] = bad
    assert offenders == {}


@pytest.mark.timeout(600)
def test_wheel_installs_only_kernelstream(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("kernelstream-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"kernelstream"}
    for needed in (
        "kernelstream/app/cli/main.py",
        "kernelstream/agents/logic/search.py",
        "kernelstream/kernels/cuda/matmul.cu",
        "kernelstream/schemas/json/ks.launch_batch.v1.schema.json",
    ):
        assert needed in names
    # the compiled window passes, where this install could build them (schemas.native)
    if native.core is not None:
        assert any(n.startswith("kernelstream/_native.") and n.endswith(".so") for n in names)
