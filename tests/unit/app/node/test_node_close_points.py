"""The node sends its open batches when its launches pass a worker window's close point."""

from __future__ import annotations

from kernelstream.app.node.runtime import WindowClosePoints


def test_close_points_pass_once_each_and_not_at_the_first_launch() -> None:
    cp = WindowClosePoints(window_s=1.0, out_of_orderness_s=0.0, allowed_lateness_s=0.05)
    assert not cp.passed(100.20)  # the first launch seen: nothing to compare with
    assert not cp.passed(100.90)
    assert not cp.passed(101.04)  # window [100, 101) closes at 101.05
    assert cp.passed(101.05)
    assert not cp.passed(101.30)
    assert not cp.passed(101.00)  # an older launch never passes a point again
    assert cp.passed(102.10)
    assert cp.passed(105.06)  # several points at once: one flush


def test_close_points_follow_the_window_settings() -> None:
    cp = WindowClosePoints(window_s=0.5, out_of_orderness_s=0.2, allowed_lateness_s=0.1)
    assert not cp.passed(10.31)
    assert not cp.passed(10.79)
    assert cp.passed(10.81)  # window [10.0, 10.5) closes at 10.5 + 0.2 + 0.1
