"""Every .cu compiles with NVRTC from PyPI (the compiler CuPy's RawKernel uses) for sm_80 and
sm_90, at its default and across a sample of its space, with no GPU and no CUDA toolkit; the
compiler's resource report is parsed, cached, and errors come back per configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelstream.kernels import WORKLOAD_NAMES, get_workload
from kernelstream.kernels.check import sample_configs
from kernelstream.kernels.compile import compile_config, compiler_version, parse_ptxas_info

ARCHS = ("sm_80", "sm_90")

# A kernel that needs more than 32 registers: capped at 32 it spills to local memory.
HUNGRY = r"""
extern "C" __global__ void hungry(const float* __restrict__ x, float* __restrict__ y, int k)
{
    float a[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) a[i] = x[threadIdx.x * 64 + i];
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 64; ++i) s += a[i] * a[(i * 7 + 3) & 63];
    y[threadIdx.x] = s + a[k & 63];
}
"""


def test_nvrtc_is_installed() -> None:
    """The `compile` extra is part of `dev`: CI installs it, so this never skips there."""
    assert compiler_version().startswith("nvrtc 12.")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_workload_compiles_with_real_resources(name: str, arch: str, tmp_path: Path) -> None:
    w = get_workload(name)
    for config in sample_configs(w, 5):
        r = compile_config(w.source, w.kernel_name, w.defines(config), arch, cache_dir=tmp_path)
        where = f"{name} {arch} {w.space.config_id(config)}"
        assert r.ok, f"{where}\n{r.log}"
        assert r.registers is not None and 0 < r.registers <= 255, where
        assert r.spills == 0 and r.local_bytes == 0, where
        # the workload's analytic shared-memory model is what the compiler allocates
        assert r.static_smem_bytes == w.traits(config).static_smem_bytes, where
        assert f"for '{arch}'" in r.log and r.compiler == compiler_version()


def test_compile_error_comes_back_with_the_log(tmp_path: Path) -> None:
    src = 'extern "C" __global__ void k(float* x) { x[0] = undefined_name; }'
    r = compile_config(src, "k", {}, "sm_80", cache_dir=tmp_path)
    assert not r.ok and r.registers is None and r.spills is None
    assert 'identifier "undefined_name" is undefined' in r.log


def test_a_define_outside_the_space_fails_that_configuration_only(tmp_path: Path) -> None:
    w = get_workload("reduction")
    # less than a warp: reduction.cu's per-warp partial sums become an array of size 0
    bad = {**w.defines(w.default), "BLOCK_SIZE": 16}
    good = compile_config(
        w.source, w.kernel_name, w.defines(w.default), "sm_90", cache_dir=tmp_path
    )
    r = compile_config(w.source, w.kernel_name, bad, "sm_90", cache_dir=tmp_path)
    assert good.ok
    assert not r.ok and "must be greater than zero" in r.log


def test_static_shared_memory_over_the_hardware_limit_is_a_compile_error(tmp_path: Path) -> None:
    # 256 KiB of static shared memory: more than any GPU allows statically (48 KiB)
    src = (
        'extern "C" __global__ void big(float* x) { __shared__ float s[65536];'
        " s[threadIdx.x] = x[threadIdx.x]; __syncthreads(); x[threadIdx.x] = s[threadIdx.x + 1]; }"
    )
    r = compile_config(src, "big", {}, "sm_90", cache_dir=tmp_path)
    assert not r.ok
    assert "uses too much shared data" in r.log


def test_spills_and_local_memory_are_read(tmp_path: Path) -> None:
    free = compile_config(HUNGRY, "hungry", {}, "sm_80", cache_dir=tmp_path)
    capped = compile_config(
        HUNGRY,
        "hungry",
        {},
        "sm_80",
        options=("-std=c++14", "--maxrregcount=32"),
        cache_dir=tmp_path,
    )
    assert free.ok and capped.ok
    assert free.registers is not None and free.registers > 32
    assert free.local_bytes is not None and free.local_bytes > 0  # a[k & 63]: indexed at run time
    assert capped.registers == 32
    assert capped.spill_store_bytes and capped.spill_load_bytes
    assert capped.local_bytes is not None and capped.local_bytes > free.local_bytes


def test_missing_kernel_and_mangled_names(tmp_path: Path) -> None:
    src = (
        "template <int N> __global__ void scale(float* x) { x[threadIdx.x] *= N; }\n"
        "template __global__ void scale<4>(float*);"
    )
    r = compile_config(src, "scale", {}, "sm_90", cache_dir=tmp_path)
    assert r.ok and r.registers
    assert not compile_config(src, "scal", {}, "sm_90", cache_dir=tmp_path).ok
    missing = compile_config(src, "nope", {}, "sm_90", cache_dir=tmp_path)
    assert not missing.ok and "kernel 'nope' is not in the compiled module" in missing.log


def _numbers(r: object) -> dict[str, object]:
    d = dict(vars(r))
    d.pop("log"), d.pop("cached")  # the log carries the compile time
    return d


def test_results_are_cached_on_disk_and_a_broken_entry_recompiles(tmp_path: Path) -> None:
    w = get_workload("transpose")
    args = (w.source, w.kernel_name, w.defines(w.default), "sm_90")
    first = compile_config(*args, cache_dir=tmp_path)
    second = compile_config(*args, cache_dir=tmp_path)
    assert not first.cached and second.cached
    assert second.to_dict() == first.to_dict()  # the log too: read back, not recompiled
    (entry,) = tmp_path.rglob("*.json")
    entry.write_bytes(b"{not json")
    third = compile_config(*args, cache_dir=tmp_path)
    assert not third.cached and _numbers(third) == _numbers(first)
    other = compile_config(*args[:3], "sm_80", cache_dir=tmp_path)
    assert not other.cached and len(list(tmp_path.rglob("*.json"))) == 2


def test_an_architecture_nvrtc_does_not_know_is_a_failed_result(tmp_path: Path) -> None:
    w = get_workload("transpose")
    r = compile_config(w.source, w.kernel_name, w.defines(w.default), "sm_20", cache_dir=tmp_path)
    assert not r.ok and "invalid value for --gpu-architecture" in r.log


def test_malformed_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="sm_XY"):
        compile_config("", "k", {}, "compute_90")
    with pytest.raises(ValueError, match="C identifiers"):
        compile_config("", "k", {"A B": 1}, "sm_90")


def test_parse_ptxas_report_of_several_kernels() -> None:
    log = """ptxas info    : Compiling entry function 'a' for 'sm_80'
ptxas info    : Function properties for helper
ptxas         .     16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Function properties for a
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 512 bytes smem, 364 bytes cmem[0]
ptxas info    : Compiling entry function 'b' for 'sm_80'
ptxas info    : Function properties for b
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers, 356 bytes cmem[0]"""
    assert parse_ptxas_info(log, "a") == {
        "registers": 40,
        "static_smem_bytes": 512,
        "local_bytes": 8,
        "spill_store_bytes": 4,
        "spill_load_bytes": 8,
    }
    b = parse_ptxas_info(log, "b")
    assert b is not None and b["registers"] == 12 and b["static_smem_bytes"] == 0
    assert parse_ptxas_info(log, "helper") is None  # not an entry function


def test_launch_only_parameters_share_one_compiled_module(tmp_path: Path) -> None:
    w = get_workload("reduction")
    a, b = ({**w.default, "num_blocks": n} for n in (32, 4096))
    assert w.defines(a) == w.defines(b) and "NUM_BLOCKS" not in w.defines(a)
    first = compile_config(w.source, w.kernel_name, w.defines(a), "sm_80", cache_dir=tmp_path)
    second = compile_config(w.source, w.kernel_name, w.defines(b), "sm_80", cache_dir=tmp_path)
    assert first.ok and second.cached
