"""``bench pipeline --pin-worker``: the worker processes on a CPU of their own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kernelstream.bench import pipeline_procs
from kernelstream.bench.pipeline_procs import pinned_cpus

_SHOW = "import os; print(','.join(map(str, sorted(os.sched_getaffinity(0)))))"


def _child_cpus() -> list[int]:
    """The CPUs a process the benchmark spawns as a worker may run on."""
    out = subprocess.run(
        [sys.executable, "-c", _SHOW],
        preexec_fn=pipeline_procs._child_setup,
        capture_output=True,
        check=True,
        text=True,
    )
    return [int(c) for c in out.stdout.strip().split(",")]


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="pinning needs Linux and at least 2 CPUs",
)
def test_worker_on_the_last_cpu_everything_else_on_the_others() -> None:
    before = os.sched_getaffinity(0)
    with pinned_cpus(True) as split:
        assert split is not None
        assert split["worker"] == [max(before)]
        assert split["others"] == sorted(before - {max(before)})
        # this process, and what it starts other than a worker (the broker, a peer)
        assert os.sched_getaffinity(0) == set(split["others"])
        other = subprocess.run(
            [sys.executable, "-c", _SHOW], capture_output=True, check=True, text=True
        )
        assert [int(c) for c in other.stdout.strip().split(",")] == split["others"]
        assert _child_cpus() == split["worker"]
    assert os.sched_getaffinity(0) == before
    assert _child_cpus() == sorted(before)  # unpinned again


def test_off_changes_nothing() -> None:
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    with pinned_cpus(False) as split:
        assert split is None
        if before is not None:
            assert os.sched_getaffinity(0) == before


def test_one_cpu_is_a_one_line_error_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from kernelstream.bench.pipeline import command

    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0}, raising=False)
    got = CliRunner().invoke(command, ["--json", "x.json", "--latency-only", "--pin-worker"])
    assert got.exit_code == 2
    assert "Traceback" not in got.output
    assert "--pin-worker" in got.output and "needs at least 2 CPUs" in got.output
