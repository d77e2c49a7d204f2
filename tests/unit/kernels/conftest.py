"""Fixtures of the kernels tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import kernelstream.kernels.backends.trace as trace


@pytest.fixture
def cache_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the Kernel Tuner cache files parsed (``trace.load_cache``), in order."""
    reads: list[str] = []
    real = trace.load_cache

    def counted(path: Any) -> Any:
        reads.append(Path(path).name)
        return real(path)

    monkeypatch.setattr(trace, "load_cache", counted)
    return reads
