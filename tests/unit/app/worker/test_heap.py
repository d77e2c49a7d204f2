"""The worker keeps freed heap for reuse: a poll's megabytes do not fault in again."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from kernelstream.app.worker.start import retain_heap

# A poll's pattern: blocks of 1-12 MiB written, all freed, again and again. Prints the
# minor page faults of the later cycles per MiB written.
_CYCLES = """
import resource, sys
import numpy as np
from kernelstream.app.worker.start import retain_heap
assert retain_heap(int(sys.argv[1])) == (int(sys.argv[1]) > 0)
sizes = [1, 12, 3, 8, 2, 6, 4, 10]
def cycle():
    blocks = [np.ones((mib << 20) // 8) for mib in sizes]
    del blocks
for _ in range(5):
    cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    cycle()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(faults / (20 * sum(sizes)))
"""


def _faults_per_mib(mib: int) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _CYCLES, str(mib)], capture_output=True, text=True, check=True
    )
    return float(out.stdout)


def test_nothing_to_set_at_zero() -> None:
    assert retain_heap(0) is False


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_freed_blocks_are_reused_without_faulting_in_again() -> None:
    # 256 pages of 4 KiB make a MiB: with the heap kept, a repeat cycle faults next to none.
    kept = _faults_per_mib(64)
    assert kept < 2.0, kept
    # with glibc's defaults some blocks are mapped afresh or given back each cycle: a
    # quarter of the pages faulted in again here (66 of 256 per MiB)
    assert _faults_per_mib(0) > 20
