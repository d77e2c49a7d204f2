"""Device specs, name mapping, occupancy and waves on hand-worked examples."""

from __future__ import annotations

import pytest

from kernelstream.kernels import SIM_MODELS, get_device_spec
from kernelstream.kernels.devices import device_spec_for_name, theoretical_occupancy, waves
from kernelstream.kernels.errors import UnknownDeviceError


def test_required_models_with_published_peaks() -> None:
    for name in ("A100-SXM4-80GB", "H100-SXM5-80GB", "RTX-A4000", "L4", "A100-PCIE-40GB"):
        spec = get_device_spec(name)
        assert name in SIM_MODELS and spec.source
    assert get_device_spec("A100-PCIE-40GB").peak_gbs == 1555.0
    assert get_device_spec("RTX-A4000").peak_gbs == 448.0


def test_kernel_tuner_device_names() -> None:
    assert device_spec_for_name("NVIDIA A100-PCIE-40GB").name == "A100-PCIE-40GB"
    assert device_spec_for_name("NVIDIA RTX A4000").name == "RTX-A4000"
    assert device_spec_for_name("NVIDIA L4").name == "L4"
    with pytest.raises(UnknownDeviceError, match="known models"):
        device_spec_for_name("NVIDIA GeForce GTX 480")


def test_driver_names_with_brand_words_and_variants() -> None:
    assert device_spec_for_name("NVIDIA RTX A6000").name == "RTX-A6000"
    assert device_spec_for_name("NVIDIA GeForce RTX 2080 Ti").name == "RTX-2080-Ti"
    assert device_spec_for_name("NVIDIA TITAN RTX").name == "TITAN-RTX"
    assert device_spec_for_name("Tesla V100-SXM2-32GB").name == "V100-SXM2"  # memory size
    assert device_spec_for_name("Tesla V100-PCIE-16GB").name == "V100-PCIE"
    assert device_spec_for_name("NVIDIA H100").name == "H100-SXM5-80GB"  # one H100 known
    # Another model whose name starts with a known one's is not that model.
    for other in ("NVIDIA T400", "NVIDIA L40S", "NVIDIA GeForce RTX 3090 Ti", "A4000"):
        with pytest.raises(UnknownDeviceError):
            device_spec_for_name(other)


def test_unknown_model_has_no_roofline_and_no_made_up_limits() -> None:
    from kernelstream.kernels.devices import DeviceSpec

    spec = DeviceSpec.unknown("AMD Instinct MI250X")
    assert spec.name == "AMD Instinct MI250X" and not spec.peaks_known
    assert (spec.peak_gbs, spec.peak_gflops_fp32, spec.sms) == (0.0, 0.0, 0)
    assert theoretical_occupancy(spec, 256, 32, 0) == (0.0, 0)
    assert waves(spec, 4096, 0) == 0.0
    assert get_device_spec("A100-PCIE-40GB").peaks_known


def test_occupancy_hand_examples() -> None:
    a100 = get_device_spec("A100-SXM4-80GB")
    # 256 threads, 32 regs: 8 warps; warp limit 64/8 = 8 blocks; regs 8192/block -> 8.
    assert theoretical_occupancy(a100, 256, 32, 0) == (1.0, 8)
    # 128 regs/thread: 4096 per warp, 32768 per block -> 2 blocks = 16 warps = 25%.
    assert theoretical_occupancy(a100, 256, 128, 0) == (0.25, 2)
    # 48 KiB + 1 KiB reserved per block in 164 KiB -> 3 blocks of 8 warps.
    assert theoretical_occupancy(a100, 256, 32, 48 * 1024) == (24 / 64, 3)
    # 64 threads hit the 32 blocks/SM limit: 64 warps -> 100%.
    assert theoretical_occupancy(a100, 64, 32, 0) == (1.0, 32)
    # A4000 (1536 threads/SM, 16 blocks/SM): 32-thread blocks -> 16 warps of 48.
    assert theoretical_occupancy(get_device_spec("RTX-A4000"), 32, 32, 0) == (16 / 48, 16)
    assert theoretical_occupancy(a100, 2048, 32, 0) == (0.0, 0)
    # Compute capability 7.5 (1024 threads/SM, 16 blocks/SM, no per-block reservation):
    # 64-thread blocks without shared memory hit the block limit, 16 x 2 warps of 32.
    assert theoretical_occupancy(get_device_spec("T4"), 64, 32, 0) == (1.0, 16)


def test_waves() -> None:
    a100 = get_device_spec("A100-SXM4-80GB")
    assert waves(a100, 108 * 8, 8) == 1.0
    assert waves(a100, 54, 1) == 0.5
    assert waves(a100, 10, 0) == 0.0


def test_cupy_backend_without_cupy_names_the_extra() -> None:
    import importlib.util

    from kernelstream.kernels import open_device
    from kernelstream.kernels.errors import BackendUnavailableError, UnknownDeviceError

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here; the missing-CuPy path cannot be exercised")
    with pytest.raises(BackendUnavailableError, match=r"pip install 'kernelstream\[gpu\]'"):
        open_device("cupy")
    with pytest.raises(UnknownDeviceError):
        open_device("opencl")


def test_every_model_has_its_links_with_a_source() -> None:
    from kernelstream.kernels.devices import DEVICE_SPECS, DeviceSpec

    for spec in DEVICE_SPECS.values():
        assert spec.pcie_gbs in (15.75, 31.5, 63.0), spec.name
        assert spec.nvlink_gbs >= 0
        assert "PCIe Gen" in spec.link_source and "NVLink" in spec.link_source, spec.name
    h100 = DEVICE_SPECS["H100-SXM5-80GB"]
    assert (h100.pcie_gbs, h100.nvlink_gbs) == (63.0, 450.0)  # Gen5 x16; 900 GB/s both ways
    assert DeviceSpec.unknown("MI250X").pcie_gbs == 0.0
