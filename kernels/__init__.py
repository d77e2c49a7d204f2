"""kernels: CUDA workloads, GPU device models and the device backends that run them.

Pure Python and NumPy; CuPy is imported only when the ``cupy`` backend is opened.

>>> from kernels import get_workload, open_device
>>> dev = open_device("sim", model="A100-SXM4-80GB")
>>> w = get_workload("transpose")
>>> dev.launch(w, w.default, 3).ok.all()
np.True_
"""

from __future__ import annotations

from kernelstream.kernels.backends import (
    SIM_MODELS,
    Device,
    LaunchPlan,
    LaunchResult,
    TraceSpace,
    default_tuning_spaces_dir,
    load_cache,
    open_device,
)
from kernelstream.kernels.devices import DeviceSpec, device_spec_for_name, get_device_spec
from kernelstream.kernels.errors import KernelsError
from kernelstream.kernels.workloads import WORKLOAD_NAMES, Workload, get_workload

__all__ = [
    "SIM_MODELS",
    "WORKLOAD_NAMES",
    "Device",
    "DeviceSpec",
    "KernelsError",
    "LaunchPlan",
    "LaunchResult",
    "TraceSpace",
    "Workload",
    "default_tuning_spaces_dir",
    "device_spec_for_name",
    "get_device_spec",
    "get_workload",
    "load_cache",
    "open_device",
]
