"""Quotients of measured quantities, kept within what a record may hold."""

from __future__ import annotations

import sys

__all__ = ["finite_ratio"]

_LARGEST = sys.float_info.max


def finite_ratio(num: float, den: float) -> float:
    """``num / den`` of two non-negative finite numbers: 0 where ``den`` is not
    positive, and never more than the largest float.

    Valid input can still overflow a quotient: a launch of 1e-300 us that moves
    1e8 bytes, a device that reports a peak of 1e-300 GB/s. No record may hold an
    infinity, and a record that fails its validation where the worker builds it would
    stop the stage again on every restart; the largest float says "absurdly large"
    and keeps the window and its finding.

    >>> finite_ratio(1e9, 1e-300), finite_ratio(3.0, 0.0), finite_ratio(1.0, 4.0)
    (1.7976931348623157e+308, 0.0, 0.25)
    """
    return min(num / den, _LARGEST) if den > 0 else 0.0
