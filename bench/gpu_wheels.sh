#!/usr/bin/env bash
# Download, on a machine with network access, the wheels that the GPU machine's image
# lacks, so bench/gpu_session.sh can install them there offline (it reaches no registry).
#
# The list is kernelstream's dependency closure (core and the `embedded` extra, as
# read from pyproject.toml, versions as installed in this checkout's .venv) minus what the GPU image already
# holds (its package list in the device notes: CuPy, nvidia-ml-py, NumPy, SciPy,
# scikit-learn, matplotlib, click, rich, aiohttp, prometheus-client, pytest, ...).
# Python 3.12, x86-64 manylinux wheels, one file per package (--no-deps).
#
#   bench/gpu_wheels.sh                 # -> var/gpu-wheels/ (ignored by git; carry it)
#   bench/gpu_wheels.sh DIR
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-var/gpu-wheels}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$DEST"
mapfile -t SPECS < <("$PY" - <<'EOF'
import importlib.metadata as md
from packaging.requirements import Requirement

# On the GPU image already (device notes, package list of 2026-11-17); kept there.
IMAGE = set("""aiohappyeyeballs aiohttp aiosignal attrs certifi charset-normalizer click
cloudpickle colorama contourpy cycler fonttools frozenlist idna joblib kiwisolver
markdown-it-py matplotlib mdurl multidict mypy-extensions narwhals numpy packaging pillow
prometheus-client propcache psutil pygments pyparsing python-dateutil pyyaml requests rich
scikit-learn scipy six sortedcontainers threadpoolctl tqdm urllib3 yarl""".split())
ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython"}

def norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")

import tomllib

# The root from pyproject.toml itself (an editable install's metadata may be stale).
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
roots = [*project["dependencies"], *project["optional-dependencies"]["embedded"]]
seen: dict[str, str] = {}
todo = [(r.name, tuple(r.extras)) for r in map(Requirement, roots)]
while todo:
    name, extras = todo.pop()
    key = norm(name)
    try:
        version = md.version(name)
    except md.PackageNotFoundError:
        continue
    if key in seen and not extras:
        continue
    seen[key] = version
    for raw in md.requires(name) or []:
        req = Requirement(raw)
        if req.marker and not any(
            req.marker.evaluate({**ENV, "extra": e}) for e in (*extras, "")
        ):
            continue
        todo.append((req.name, tuple(req.extras)))
for key, version in sorted(seen.items()):
    if key != "kernelstream" and key not in IMAGE:
        print(f"{key}=={version}")
EOF
)
for spec in "${SPECS[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
    -d "$DEST" "$spec"
done
# CUPTI's Python bindings for bench telemetry-timing, matching the image's CUPTI 13.0
# (nvidia-cuda-cupti 13.0.85 there); the benchmark skips CUPTI without them.
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$DEST" "cupti-python==13.0.1" || echo "cupti-python not downloaded: CUPTI is skipped"
echo "${#SPECS[@]} packages: ${SPECS[*]}"
du -sh "$DEST"
echo "carry $DEST to the GPU machine (run's carry: [\"$DEST\"]); gpu_session.sh installs it"
