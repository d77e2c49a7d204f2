"""Named GPU models: published peaks and the per-SM limits occupancy depends on.

Peaks come from NVIDIA datasheets; per-SM limits from the CUDA C++ Programming
Guide, "Features and Technical Specifications" table (per compute capability).
``launch_overhead_us`` is not a datasheet number: it is the commonly measured
few-microsecond launch latency of a CUDA kernel, used as a modelling constant.
Links (``pcie_gbs``, ``nvlink_gbs``) are theoretical peaks per direction: PCIe from
the lane rate of its generation, NVLink from the datasheets (see ``_LINKS``).

>>> spec = get_device_spec("A100-SXM4-80GB")
>>> theoretical_occupancy(spec, threads_per_block=256, regs_per_thread=32, smem_per_block=0)
(1.0, 8)
>>> waves(spec, blocks=1728, resident_blocks_per_sm=8)
2.0
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kernelstream.kernels.errors import UnknownDeviceError

__all__ = [
    "DEVICE_SPECS",
    "DeviceSpec",
    "clocks_memory",
    "device_spec_for_name",
    "get_device_spec",
    "theoretical_occupancy",
    "waves",
]

_KIB = 1024
_MIB = 1024 * 1024


@dataclass(frozen=True)
class DeviceSpec:
    """One GPU model: peaks, per-SM resource limits, and where the numbers come from."""

    name: str
    sms: int
    peak_gbs: float
    peak_gflops_fp32: float
    max_threads_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int
    smem_per_sm_bytes: int
    max_smem_per_block_bytes: int
    l2_bytes: int
    launch_overhead_us: float = 3.0
    warp_size: int = 32
    max_threads_per_block: int = 1024
    compute_capability: tuple[int, int] = (8, 0)
    tdp_w: float = 300.0
    idle_w: float = 50.0
    # CUDA reserves 1 KiB of shared memory per resident block on cc >= 8.0
    # (CUDA C++ Programming Guide, "Shared Memory" for compute capability 8.x/9.0).
    smem_reserved_per_block_bytes: int = 1 * _KIB
    # Registers are allocated per warp in units of 256 (CUDA occupancy calculator).
    reg_alloc_unit: int = 256
    source: str = ""

    @property
    def pcie_gbs(self) -> float:
        """Host link (PCIe x16) peak per direction, GB/s; 0 when not known."""
        return _link_of(self.name)[0]

    @property
    def nvlink_gbs(self) -> float:
        """GPU-to-GPU NVLink peak per direction, GB/s; 0 when the model has none."""
        return _link_of(self.name)[1]

    @property
    def link_source(self) -> str:
        return _link_of(self.name)[2]

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // self.warp_size

    @property
    def peaks_known(self) -> bool:
        """False for :meth:`unknown`: there is no roofline to place a launch on."""
        return self.peak_gbs > 0 and self.peak_gflops_fp32 > 0

    @classmethod
    def unknown(cls, name: str) -> DeviceSpec:
        """A GPU model this table does not know (a trace file from another GPU).

        Its peaks and per-SM limits are not known, so they are 0, never a guess: its
        telemetry reports peaks of 0, occupancy and waves of 0, and the detector says
        the window cannot be placed on a roofline. Measured durations, which are what
        the tuner acts on, are unaffected.

        >>> s = DeviceSpec.unknown("AMD Instinct MI250X")
        >>> s.peaks_known, theoretical_occupancy(s, 256, 32, 0), waves(s, 4096, 0)
        (False, (0.0, 0), 0.0)
        """
        return cls(
            name=name,
            sms=0,
            peak_gbs=0.0,
            peak_gflops_fp32=0.0,
            max_threads_per_sm=0,
            max_blocks_per_sm=0,
            regs_per_sm=0,
            smem_per_sm_bytes=0,
            max_smem_per_block_bytes=0,
            l2_bytes=0,
            source="not in kernels/devices.py: peaks and per-SM limits unknown",
        )


# Per-compute-capability limits: CUDA C++ Programming Guide, "Features and Technical
# Specifications", table "Technical Specifications per Compute Capability".
# Compute capability 7.x reserves no shared memory per block (the 1 KiB reservation
# starts with 8.0), and 7.x blocks may opt in to all of an SM's shared memory.
_CC70 = {
    "max_threads_per_sm": 2048,
    "max_blocks_per_sm": 32,
    "regs_per_sm": 65536,
    "smem_per_sm_bytes": 96 * _KIB,
    "max_smem_per_block_bytes": 96 * _KIB,
    "smem_reserved_per_block_bytes": 0,
}
_CC75 = {
    "max_threads_per_sm": 1024,
    "max_blocks_per_sm": 16,
    "regs_per_sm": 65536,
    "smem_per_sm_bytes": 64 * _KIB,
    "max_smem_per_block_bytes": 64 * _KIB,
    "smem_reserved_per_block_bytes": 0,
}
_CC80 = {
    "max_threads_per_sm": 2048,
    "max_blocks_per_sm": 32,
    "regs_per_sm": 65536,
    "smem_per_sm_bytes": 164 * _KIB,
    "max_smem_per_block_bytes": 163 * _KIB,
}
_CC86 = {
    "max_threads_per_sm": 1536,
    "max_blocks_per_sm": 16,
    "regs_per_sm": 65536,
    "smem_per_sm_bytes": 100 * _KIB,
    "max_smem_per_block_bytes": 99 * _KIB,
}
_CC89 = {
    "max_threads_per_sm": 1536,
    "max_blocks_per_sm": 24,
    "regs_per_sm": 65536,
    "smem_per_sm_bytes": 100 * _KIB,
    "max_smem_per_block_bytes": 99 * _KIB,
}
_CC90 = {
    "max_threads_per_sm": 2048,
    "max_blocks_per_sm": 32,
    "regs_per_sm": 65536,
    "smem_per_sm_bytes": 228 * _KIB,
    "max_smem_per_block_bytes": 227 * _KIB,
}

DEVICE_SPECS: dict[str, DeviceSpec] = {
    s.name: s
    for s in (
        # NVIDIA A100 Tensor Core GPU datasheet: 2,039 GB/s (80GB SXM), FP32 19.5 TFLOPS,
        # 400 W; 108 SMs and 40 MB L2 from the NVIDIA A100 architecture whitepaper.
        DeviceSpec(
            name="A100-SXM4-80GB",
            sms=108,
            peak_gbs=2039.0,
            peak_gflops_fp32=19500.0,
            l2_bytes=40 * _MIB,
            compute_capability=(8, 0),
            tdp_w=400.0,
            idle_w=60.0,
            source="NVIDIA A100 datasheet; A100 whitepaper; CUDA Programming Guide cc 8.0",
            **_CC80,
        ),
        # NVIDIA A100 datasheet: 1,555 GB/s (40GB PCIe), FP32 19.5 TFLOPS, 250 W.
        DeviceSpec(
            name="A100-PCIE-40GB",
            sms=108,
            peak_gbs=1555.0,
            peak_gflops_fp32=19500.0,
            l2_bytes=40 * _MIB,
            compute_capability=(8, 0),
            tdp_w=250.0,
            idle_w=35.0,
            source="NVIDIA A100 datasheet; A100 whitepaper; CUDA Programming Guide cc 8.0",
            **_CC80,
        ),
        # NVIDIA H100 Tensor Core GPU datasheet (SXM5): 3.35 TB/s, FP32 67 TFLOPS, 700 W;
        # 132 SMs and 50 MB L2 from the NVIDIA H100 (Hopper) architecture whitepaper.
        DeviceSpec(
            name="H100-SXM5-80GB",
            sms=132,
            peak_gbs=3350.0,
            peak_gflops_fp32=67000.0,
            l2_bytes=50 * _MIB,
            compute_capability=(9, 0),
            tdp_w=700.0,
            idle_w=70.0,
            source="NVIDIA H100 datasheet; Hopper whitepaper; CUDA Programming Guide cc 9.0",
            **_CC90,
        ),
        # NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e at 4.8 TB/s, FP32 67
        # TFLOPS, up to 700 W; the same GH100 die as the H100 SXM5 (132 SMs, 50 MB L2).
        # The driver names it "NVIDIA H200".
        DeviceSpec(
            name="H200-SXM-141GB",
            sms=132,
            peak_gbs=4800.0,
            peak_gflops_fp32=67000.0,
            l2_bytes=50 * _MIB,
            compute_capability=(9, 0),
            tdp_w=700.0,
            idle_w=75.0,
            source="NVIDIA H200 datasheet; Hopper whitepaper; CUDA Programming Guide cc 9.0",
            **_CC90,
        ),
        # NVIDIA RTX A4000 datasheet: 448 GB/s, FP32 19.2 TFLOPS, 140 W, 48 SMs
        # (6144 CUDA cores / 128 per SM); 4 MB L2 (NVIDIA Ampere GA104 whitepaper).
        DeviceSpec(
            name="RTX-A4000",
            sms=48,
            peak_gbs=448.0,
            peak_gflops_fp32=19200.0,
            l2_bytes=4 * _MIB,
            compute_capability=(8, 6),
            tdp_w=140.0,
            idle_w=15.0,
            source="NVIDIA RTX A4000 datasheet; GA102/GA104 whitepaper; CUDA Guide cc 8.6",
            **_CC86,
        ),
        # NVIDIA L4 datasheet: 300 GB/s, FP32 30.3 TFLOPS, 72 W; 58 SMs and 48 MB L2
        # (NVIDIA Ada Lovelace architecture whitepaper, AD104).
        DeviceSpec(
            name="L4",
            sms=58,
            peak_gbs=300.0,
            peak_gflops_fp32=30300.0,
            l2_bytes=48 * _MIB,
            compute_capability=(8, 9),
            tdp_w=72.0,
            idle_w=16.0,
            source="NVIDIA L4 datasheet; Ada whitepaper; CUDA Programming Guide cc 8.9",
            **_CC89,
        ),
        # NVIDIA RTX A6000 datasheet: 768 GB/s, FP32 38.7 TFLOPS, 300 W, 84 SMs (10752
        # CUDA cores / 128 per SM); 6 MB L2 (NVIDIA Ampere GA102 whitepaper).
        DeviceSpec(
            name="RTX-A6000",
            sms=84,
            peak_gbs=768.0,
            peak_gflops_fp32=38700.0,
            l2_bytes=6 * _MIB,
            compute_capability=(8, 6),
            tdp_w=300.0,
            idle_w=25.0,
            source="NVIDIA RTX A6000 datasheet; GA102 whitepaper; CUDA Guide cc 8.6",
            **_CC86,
        ),
        # NVIDIA A40 datasheet: 696 GB/s, FP32 37.4 TFLOPS, 300 W; GA102 with 84 SMs and
        # 6 MB L2 (NVIDIA Ampere GA102 whitepaper).
        DeviceSpec(
            name="A40",
            sms=84,
            peak_gbs=696.0,
            peak_gflops_fp32=37400.0,
            l2_bytes=6 * _MIB,
            compute_capability=(8, 6),
            tdp_w=300.0,
            idle_w=30.0,
            source="NVIDIA A40 datasheet; GA102 whitepaper; CUDA Guide cc 8.6",
            **_CC86,
        ),
        # GeForce RTX 3090 (NVIDIA Ampere GA102 whitepaper, appendix): 936 GB/s, FP32
        # 35.6 TFLOPS, 350 W, 82 SMs, 6 MB L2.
        DeviceSpec(
            name="RTX-3090",
            sms=82,
            peak_gbs=936.0,
            peak_gflops_fp32=35600.0,
            l2_bytes=6 * _MIB,
            compute_capability=(8, 6),
            tdp_w=350.0,
            idle_w=25.0,
            source="NVIDIA Ampere GA102 whitepaper (RTX 3090); CUDA Guide cc 8.6",
            **_CC86,
        ),
        # GeForce RTX 4090 (NVIDIA Ada Lovelace whitepaper, appendix): 1,008 GB/s, FP32
        # 82.6 TFLOPS, 450 W, 128 SMs, 72 MB L2.
        DeviceSpec(
            name="RTX-4090",
            sms=128,
            peak_gbs=1008.0,
            peak_gflops_fp32=82600.0,
            l2_bytes=72 * _MIB,
            compute_capability=(8, 9),
            tdp_w=450.0,
            idle_w=25.0,
            source="NVIDIA Ada Lovelace whitepaper (RTX 4090); CUDA Guide cc 8.9",
            **_CC89,
        ),
        # GeForce RTX 2080 Ti (NVIDIA Turing whitepaper, reference board): 616 GB/s, FP32
        # 13.4 TFLOPS, 250 W, 68 SMs, 5.5 MB L2.
        DeviceSpec(
            name="RTX-2080-Ti",
            sms=68,
            peak_gbs=616.0,
            peak_gflops_fp32=13400.0,
            l2_bytes=5632 * _KIB,
            compute_capability=(7, 5),
            tdp_w=250.0,
            idle_w=20.0,
            source="NVIDIA Turing whitepaper (RTX 2080 Ti); CUDA Guide cc 7.5",
            **_CC75,
        ),
        # NVIDIA TITAN RTX product page: 672 GB/s, FP32 16.3 TFLOPS, 280 W; TU102 with
        # all 72 SMs and 6 MB L2 (NVIDIA Turing whitepaper).
        DeviceSpec(
            name="TITAN-RTX",
            sms=72,
            peak_gbs=672.0,
            peak_gflops_fp32=16300.0,
            l2_bytes=6 * _MIB,
            compute_capability=(7, 5),
            tdp_w=280.0,
            idle_w=20.0,
            source="NVIDIA TITAN RTX specifications; Turing whitepaper; CUDA Guide cc 7.5",
            **_CC75,
        ),
        # NVIDIA T4 datasheet: 320 GB/s, FP32 8.1 TFLOPS, 70 W; 40 SMs and 4 MB L2
        # (NVIDIA Turing whitepaper, TU104).
        DeviceSpec(
            name="T4",
            sms=40,
            peak_gbs=320.0,
            peak_gflops_fp32=8100.0,
            l2_bytes=4 * _MIB,
            compute_capability=(7, 5),
            tdp_w=70.0,
            idle_w=10.0,
            source="NVIDIA T4 datasheet; Turing whitepaper; CUDA Guide cc 7.5",
            **_CC75,
        ),
        # NVIDIA V100 datasheet: 900 GB/s; FP32 15.7 TFLOPS and 300 W (SXM2), 14 TFLOPS and
        # 250 W (PCIe); 80 SMs and 6 MB L2 (NVIDIA Tesla V100 whitepaper).
        DeviceSpec(
            name="V100-SXM2",
            sms=80,
            peak_gbs=900.0,
            peak_gflops_fp32=15700.0,
            l2_bytes=6 * _MIB,
            compute_capability=(7, 0),
            tdp_w=300.0,
            idle_w=40.0,
            source="NVIDIA V100 datasheet; Volta whitepaper; CUDA Guide cc 7.0",
            **_CC70,
        ),
        DeviceSpec(
            name="V100-PCIE",
            sms=80,
            peak_gbs=900.0,
            peak_gflops_fp32=14000.0,
            l2_bytes=6 * _MIB,
            compute_capability=(7, 0),
            tdp_w=250.0,
            idle_w=35.0,
            source="NVIDIA V100 datasheet; Volta whitepaper; CUDA Guide cc 7.0",
            **_CC70,
        ),
    )
}

# Per direction, x16: 8, 16 and 32 GT/s a lane with 128b/130b encoding (PCI Express Base
# Specification 3.0, 4.0, 5.0) give 15.75, 31.5 and 63.0 GB/s.
_PCIE_GBS = {3: 15.75, 4: 31.5, 5: 63.0}
# (PCIe generation of the host interface, NVLink GB/s per direction: half the datasheet's
# bidirectional total, 0 when the model has none), from each model's datasheet.
_LINKS: dict[str, tuple[int, float, str]] = {
    "A100-SXM4-80GB": (4, 300.0, "A100 datasheet: PCIe Gen4, NVLink 600 GB/s"),
    "A100-PCIE-40GB": (4, 300.0, "A100 datasheet: PCIe Gen4, NVLink bridge 600 GB/s"),
    "H100-SXM5-80GB": (5, 450.0, "H100 datasheet: PCIe Gen5, NVLink 900 GB/s"),
    "H200-SXM-141GB": (5, 450.0, "H200 datasheet: PCIe Gen5, NVLink 900 GB/s"),
    "RTX-A4000": (4, 0.0, "RTX A4000 datasheet: PCIe Gen4 x16, no NVLink"),
    "L4": (4, 0.0, "L4 datasheet: PCIe Gen4 x16, no NVLink"),
    "RTX-A6000": (4, 56.25, "RTX A6000 datasheet: PCIe Gen4, NVLink 112.5 GB/s"),
    "A40": (4, 56.25, "A40 datasheet: PCIe Gen4, NVLink 112.5 GB/s"),
    "RTX-3090": (4, 56.25, "GeForce RTX 3090 specifications: PCIe Gen4, NVLink 112.5 GB/s"),
    "RTX-4090": (4, 0.0, "GeForce RTX 4090 specifications: PCIe Gen4, no NVLink"),
    "RTX-2080-Ti": (3, 50.0, "Turing whitepaper: PCIe Gen3, NVLink 100 GB/s"),
    "TITAN-RTX": (3, 50.0, "TITAN RTX specifications: PCIe Gen3, NVLink 100 GB/s"),
    "T4": (3, 0.0, "T4 datasheet: PCIe Gen3 x16, no NVLink"),
    "V100-SXM2": (3, 150.0, "V100 datasheet: PCIe Gen3, NVLink 300 GB/s"),
    "V100-PCIE": (3, 0.0, "V100 datasheet: PCIe Gen3 x16, no NVLink"),
}


# Maximum SM (boost) clock in MHz and memory in GiB per model, for the device alerts
# (agents.logic.forecast): a clock sagging well below the boost clock, memory filling
# toward the total. GPU memory sizes in datasheets ("80GB") are binary gigabytes
# (nvidia-smi reports an A100 80GB as 81920 MiB). A model not listed has no clock or
# memory threshold, so its device series raise no alert.
_CLOCKS_MEMORY: dict[str, tuple[float, int, str]] = {
    "A100-SXM4-80GB": (1410.0, 80, "A100 whitepaper, table 1: boost 1410 MHz; datasheet 80GB"),
    "A100-PCIE-40GB": (1410.0, 40, "A100 whitepaper, table 1: boost 1410 MHz; datasheet 40GB"),
    "H100-SXM5-80GB": (1980.0, 80, "H100 datasheet (SXM5): max boost 1980 MHz, 80GB"),
    "H200-SXM-141GB": (1980.0, 141, "H200 datasheet: 141GB HBM3e; Hopper SXM boost 1980 MHz"),
    "RTX-3090": (1695.0, 24, "NVIDIA Ampere GA102 whitepaper: RTX 3090 boost 1695 MHz, 24GB"),
    "RTX-4090": (2520.0, 24, "NVIDIA Ada Lovelace whitepaper: RTX 4090 boost 2520 MHz, 24GB"),
    "RTX-A6000": (1800.0, 48, "NVIDIA RTX A6000 datasheet: boost 1800 MHz, 48GB"),
    "L4": (2040.0, 24, "NVIDIA L4 datasheet: max boost 2040 MHz, 24GB"),
}


def clocks_memory(name: str) -> tuple[float, int, str]:
    """(boost clock MHz, memory bytes, source) of a model; zeros for one not listed.

    >>> clocks_memory("A100-SXM4-80GB")[:2]
    (1410.0, 85899345920)
    >>> clocks_memory("AMD Instinct MI250X")[:2]
    (0.0, 0)
    """
    known = _CLOCKS_MEMORY.get(name)
    if known is None:
        return 0.0, 0, "clocks and memory not known"
    mhz, gib, source = known
    return mhz, gib << 30, source


def _link_of(name: str) -> tuple[float, float, str]:
    """(PCIe GB/s, NVLink GB/s, source) of a model; zeros for a model not in the table."""
    known = _LINKS.get(name)
    if known is None:
        return 0.0, 0.0, "links not known"
    gen, nvlink, source = known
    return _PCIE_GBS[gen], nvlink, source


# Names a driver gives a known model that no spelling rule below can tell apart from
# another model. The H100 SXM5 board names itself "NVIDIA H100 80GB HBM3" (nvidia-smi
# on one, 700 W power cap: bench/results/gpu-2026-11-24-NVIDIA-H100-80GB-HBM3/); the
# PCIe card is "NVIDIA H100 PCIe", a different model (2.0 TB/s, 350 W) not listed here.
_DRIVER_NAMES = {"h10080gbhbm3": "H100-SXM5-80GB"}

# What may follow a known model's name in a driver's name for the same model (after
# _normalise): a form factor, a memory size and type, a MIG slice.
_VARIANT = re.compile(r"(pcie|sxm\d?|nvl)?(\d+gb)?(hbm\d?e?)?(mig\w*)?")


def _normalise(name: str) -> str:
    """Lower case, letters and digits only, without the vendor and brand words drivers
    put in front of the model (``NVIDIA``, ``Tesla``, ``GeForce``, ``Quadro``)."""
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    return re.sub(r"^(nvidia)?(tesla|geforce|quadro)?", "", key)


def get_device_spec(name: str) -> DeviceSpec:
    """The spec of a named GPU model (exact key of :data:`DEVICE_SPECS`, or a loose match).

    >>> get_device_spec("a100-pcie-40gb").peak_gbs
    1555.0
    """
    if name in DEVICE_SPECS:
        return DEVICE_SPECS[name]
    return device_spec_for_name(name)


def device_spec_for_name(device_name: str) -> DeviceSpec:
    """Map a driver / Kernel Tuner ``device_name`` (e.g. ``"NVIDIA RTX A4000"``) to a spec.

    Matching ignores case, punctuation and an ``NVIDIA`` prefix; a name that
    carries the model but not the memory variant (``"NVIDIA H100"``) matches
    when exactly one known model starts with it.

    >>> device_spec_for_name("NVIDIA A100-PCIE-40GB").name
    'A100-PCIE-40GB'
    >>> device_spec_for_name("NVIDIA RTX A4000").name
    'RTX-A4000'
    >>> device_spec_for_name("Tesla V100-SXM2-32GB").name, device_spec_for_name("Tesla T4").name
    ('V100-SXM2', 'T4')
    >>> device_spec_for_name("NVIDIA H100 80GB HBM3").name, device_spec_for_name("NVIDIA H200").name
    ('H100-SXM5-80GB', 'H200-SXM-141GB')
    """
    key = _normalise(device_name)
    by_key = {_normalise(n): s for n, s in DEVICE_SPECS.items()}
    if key in by_key:
        return by_key[key]
    if _DRIVER_NAMES.get(key) in DEVICE_SPECS:
        return DEVICE_SPECS[_DRIVER_NAMES[key]]
    # "NVIDIA H100" names one model without its variant; "Tesla V100-SXM2-32GB" adds a
    # memory size to one. Anything else after a known name is another model ("T400" is
    # not a "T4", "L40S" not an "L4", "RTX 3090 Ti" not an "RTX 3090"): unknown.
    prefixed = [
        s
        for k, s in by_key.items()
        if key and (k.startswith(key) or (key.startswith(k) and _VARIANT.fullmatch(key[len(k) :])))
    ]
    if len(prefixed) == 1:
        return prefixed[0]
    raise UnknownDeviceError(
        f"unknown GPU model {device_name!r}; known models: {sorted(DEVICE_SPECS)}. "
        "Add a DeviceSpec with its datasheet peaks to kernels/devices.py."
    )


def theoretical_occupancy(
    spec: DeviceSpec,
    threads_per_block: int,
    regs_per_thread: int | None,
    smem_per_block: int,
) -> tuple[float, int]:
    """Theoretical occupancy in [0, 1] and resident blocks per SM (the CUDA occupancy rules).

    Limits: warps per SM, blocks per SM, registers (per-warp allocation in units of
    ``reg_alloc_unit``) and shared memory (plus the per-block reservation). Unknown
    register counts (``None``) are taken as 32 per thread. A block that cannot fit
    at all gives ``(0.0, 0)``.

    >>> theoretical_occupancy(get_device_spec("A100-SXM4-80GB"), 1024, 64, 0)
    (0.5, 1)
    """
    if threads_per_block <= 0 or threads_per_block > spec.max_threads_per_block:
        return 0.0, 0
    if spec.max_warps_per_sm <= 0:  # DeviceSpec.unknown: no limits to apply
        return 0.0, 0
    if smem_per_block > spec.max_smem_per_block_bytes:
        return 0.0, 0
    warps = math.ceil(threads_per_block / spec.warp_size)
    by_warps = spec.max_warps_per_sm // warps
    regs = 32 if regs_per_thread is None else max(1, regs_per_thread)
    regs_per_warp = math.ceil(regs * spec.warp_size / spec.reg_alloc_unit) * spec.reg_alloc_unit
    by_regs = spec.regs_per_sm // (regs_per_warp * warps)
    smem = smem_per_block + spec.smem_reserved_per_block_bytes
    # No shared memory and no reservation (compute capability 7.x): no limit from it.
    by_smem = spec.smem_per_sm_bytes // smem if smem else spec.max_blocks_per_sm
    resident = max(0, min(spec.max_blocks_per_sm, by_warps, by_regs, by_smem))
    occupancy = min(1.0, resident * warps / spec.max_warps_per_sm)
    return occupancy, resident


def waves(spec: DeviceSpec, blocks: int, resident_blocks_per_sm: int) -> float:
    """Blocks divided by how many blocks the whole GPU holds at once (0 when none fit)."""
    capacity = spec.sms * resident_blocks_per_sm
    return blocks / capacity if capacity > 0 else 0.0
