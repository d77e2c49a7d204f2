"""Kafka message keys: which partition owns which records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

__all__ = ["PER_STREAM_ENTRIES", "group_key", "kept_bytes", "remember", "stream_key"]

# Entries of the worker's caches that hold one entry per stream (a stream's header is its
# own: its node and device are in it; so is its configuration object where its header was
# decoded alone): each is cleared when full, so the bound is well above a worker's
# streams; below them every batch of every stream would miss. An entry of the decoders'
# caches is ~2 KB (a header decoded from a template) to ~6.6 KB (validated whole): ~33-110
# MB at the bound. (The compiled engine keeps 65,536 headers of its own, native/src/engine.rs.)
PER_STREAM_ENTRIES = 16384

K = TypeVar("K")
V = TypeVar("V")


def remember(cache: dict[K, V], key: K, value: V) -> V:
    """Keep ``value`` under ``key`` in a per-stream cache, all of it forgotten first when
    it holds :data:`PER_STREAM_ENTRIES`; returns ``value``.

    >>> c: dict[str, int] = {}
    >>> remember(c, "a", 1), c
    (1, {'a': 1})
    """
    if len(cache) >= PER_STREAM_ENTRIES:
        cache.clear()
    cache[key] = value
    return value


def kept_bytes(data: bytes) -> bytes:
    """``data`` copied into a bytes object of its own size: what a cache keeps of
    ``orjson.dumps``'s output, which orjson 3.13 hands back in its whole write buffer
    (``tracemalloc`` counts 4 KB or more held for 300 bytes of JSON).

    >>> kept_bytes(b"ab")
    b'ab'
    """
    return memoryview(data).tobytes()


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
