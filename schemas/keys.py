"""Kafka message keys: which partition owns which records."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["group_key", "stream_key"]


def stream_key(node: str, device_index: int, kernel: str) -> str:
    """Key of launches, windows and late launches: one partition owns a (device, kernel) series.

    >>> stream_key("gpu-node-1", 0, "matmul")
    'gpu-node-1:0/matmul'
    """
    return f"{node}:{device_index}/{kernel}"


def group_key(device_model: str, workload: str, problem_size: Sequence[int]) -> str:
    """Key of findings and outcomes: one tuner instance owns one fleet group.

    >>> group_key("A100-SXM4-80GB", "matmul", [2048])
    'A100-SXM4-80GB/matmul/2048'
    """
    return f"{device_model}/{workload}/{'x'.join(str(n) for n in problem_size)}"
