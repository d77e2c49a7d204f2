"""Shared fixtures: the real-data directory and the CI rule for it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def tuning_spaces_dir() -> Path:
    """``KERNELSTREAM_TUNING_SPACES_DIR`` or ``../shared/data/tuning-spaces`` beside the
    checkout (as the trace backend finds it)."""
    from kernelstream.kernels import default_tuning_spaces_dir

    return default_tuning_spaces_dir()


@pytest.fixture
def real_spaces() -> Path:
    """The measured tuning spaces; skip outside CI when missing, fail in CI."""
    d = tuning_spaces_dir()
    if not any(d.glob("*.json.gz")) if d.is_dir() else True:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the tuning spaces are missing at {d}")
        pytest.skip(f"no tuning spaces at {d} (set KERNELSTREAM_TUNING_SPACES_DIR)")
    return d
