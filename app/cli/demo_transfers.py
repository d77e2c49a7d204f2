"""The ``transfers`` scenario of ``kernelstream demo``: copies and host stalls.

Two sim nodes whose host side holds the GPU back, each in its own way:

* ``copy-a100`` copies 64 MiB in and 16 MiB out around every launch, from pageable
  memory, on one stream: ``transfer_bound``, ``pageable_copies`` and ``no_overlap``.
* ``sync-h100`` runs microsecond kernels (the built-in workloads at 1/10,000 of their
  size), one host call each, and synchronizes after every launch: ``launch_bound``
  and ``host_sync``.

The worker finds them from the nodes' ``ks.launch_batch/2`` telemetry; the demo
prints, per node, each finding with its evidence and the advice it carries. The nodes
run under host patterns, so their kernels declare the host knobs: the changes the
findings carry (pinned buffers, a second stream, batched launches, no sync after each
launch) are applied, measured by the whole step and kept or rolled back, and the demo
prints each with its outcome.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import orjson

from kernelstream.agents.logic.transfers import is_host_finding
from kernelstream.kernels.transfers import HOST_KNOBS
from kernelstream.schemas import Finding, ReconfigOutcome

__all__ = ["TRANSFER_NODES", "HostChange", "HostFindingTally", "TransferNode", "host_changes"]

_MIB = 1 << 20


@dataclass(frozen=True)
class TransferNode:
    """A sim node of the scenario: its id, GPU model, host pattern and problem scale."""

    node_id: str
    model: str
    host_pattern: dict[str, int]
    problem_scale: float = 1.0
    expected: tuple[str, ...] = ()

    def env(self) -> dict[str, str]:
        """The node's settings, as the environment of its process."""
        return {
            "KERNELSTREAM_HOST_PATTERN": orjson.dumps(self.host_pattern).decode(),
            "KERNELSTREAM_PROBLEM_SCALE": repr(self.problem_scale),
        }


TRANSFER_NODES = (
    TransferNode(
        "copy-a100",
        "A100-SXM4-80GB",
        {"h2d_bytes": 64 * _MIB, "d2h_bytes": 16 * _MIB, "pinned": 0, "streams": 1},
        expected=("transfer_bound", "pageable_copies", "no_overlap"),
    ),
    TransferNode(
        "sync-h100",
        "H100-SXM5-80GB",
        {"sync_every": 1},
        problem_scale=1e-4,
        expected=("launch_bound", "host_sync"),
    ),
)


@dataclass
class HostFindingTally:
    """Host-side findings seen during the run: counts and the latest of each kind."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    latest: dict[tuple[str, str], Finding] = field(default_factory=dict)

    def add(self, finding: Finding) -> bool:
        """Count ``finding`` if it is a host-side one; False (not taken) otherwise."""
        if not is_host_finding(finding):
            return False
        key = (finding.node, finding.classification)
        self.counts[key] += 1
        self.latest[key] = finding
        return True

    def as_dict(self) -> dict[str, int]:
        """``node/classification`` -> findings seen (for the demo's JSON summary)."""
        return {f"{n}/{c}": k for (n, c), k in sorted(self.counts.items())}

    def missing(self) -> list[str]:
        """``node: classification`` the scenario expects and the run did not show."""
        return [
            f"{n.node_id}: {c}"
            for n in TRANSFER_NODES
            for c in n.expected
            if (n.node_id, c) not in self.counts
        ]

    def lines(self) -> list[str]:
        """One block per node and finding: count, summary, evidence, advice."""
        out = []
        for (node, cls), count in sorted(self.counts.items()):
            f = self.latest[(node, cls)]
            shown = {k: v for k, v in f.evidence.items() if k not in ("host_side", "advice")}
            out.append(f"{node} {f.kernel}: {cls} x{count}: {f.summary}")
            out.append(f"    evidence {orjson.dumps(shown).decode()}")
            out.append(f"    advice: {f.evidence.get('advice')}")
        return out


@dataclass(frozen=True)
class HostChange:
    """A change of a kernel's host knobs and how it ended (kept, rolled back, ...)."""

    node: str
    kernel: str
    change: str  # e.g. "pinned 0 -> 1"
    status: str
    before_us: float | None
    after_us: float | None

    def line(self) -> str:
        """``node kernel: change: status (step before -> after us)``."""
        step = ""
        if self.before_us and self.after_us:
            step = f" (step {self.before_us:,.1f} -> {self.after_us:,.1f} us)"
        return f"{self.node} {self.kernel}: {self.change}: {self.status}{step}"

    def key(self) -> str:
        return f"{self.node}/{self.kernel}/{self.change}"


def host_changes(outcomes: list[ReconfigOutcome]) -> list[HostChange]:
    """The host-knob changes among ``outcomes``, by their final verdict (kept or
    rolled back; applied while the run ended on it)."""
    final: dict[str, HostChange] = {}
    for o in sorted(outcomes, key=lambda o: o.at):
        moved = [
            f"{k} {o.before_config[k]} -> {o.after_config[k]}"
            for k in HOST_KNOBS
            if k in o.after_config and o.before_config.get(k) != o.after_config[k]
        ]
        if not moved or o.status == "rejected":
            continue
        change = HostChange(
            o.node,
            o.kernel,
            ", ".join(moved),
            o.status,
            o.before_mean_us,
            o.after_mean_us,
        )
        if o.status != "applied" or o.recommendation_id not in final:
            final[o.recommendation_id] = change
    return list(final.values())
