"""Device specs, name mapping, occupancy and waves on hand-worked examples."""

from __future__ import annotations

import pytest

from kernels import SIM_MODELS, get_device_spec
from kernels.devices import device_spec_for_name, theoretical_occupancy, waves
from kernels.errors import UnknownDeviceError


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


def test_waves() -> None:
    a100 = get_device_spec("A100-SXM4-80GB")
    assert waves(a100, 108 * 8, 8) == 1.0
    assert waves(a100, 54, 1) == 0.5
    assert waves(a100, 10, 0) == 0.0


def test_cupy_backend_without_cupy_names_the_extra() -> None:
    import importlib.util

    from kernels import open_device
    from kernels.errors import BackendUnavailableError, UnknownDeviceError

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here; the missing-CuPy path cannot be exercised")
    with pytest.raises(BackendUnavailableError, match=r"pip install 'kernelstream\[gpu\]'"):
        open_device("cupy")
    with pytest.raises(UnknownDeviceError):
        open_device("opencl")
