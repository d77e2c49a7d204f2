"""Pure streaming logic: windows, detection and tuning, with no Faust or Kafka import.

The streaming agents, the offline replay and the tests drive these same objects.
Every stateful object offers ``snapshot() -> dict`` (JSON-able) and a ``restore``
classmethod; time is always passed in, never read from the clock.
"""

from kernelstream.agents.logic.detection import Detector, DetectorThresholds, finding_id
from kernelstream.agents.logic.errors import LogicError, LogicSettingsError, SnapshotError
from kernelstream.agents.logic.tuning import (
    GroupKey,
    GroupStats,
    GuidedLocalSearch,
    Measurement,
    Proposal,
    SlotKey,
    Strategy,
    Tuner,
    group_of,
)
from kernelstream.agents.logic.windowing import (
    LaunchRow,
    Windower,
    WindowerMetrics,
    WindowSpec,
    aggregate_reference,
    launch_rows,
    make_example_batch,
)

__all__ = [
    "Detector",
    "DetectorThresholds",
    "GroupKey",
    "GroupStats",
    "GuidedLocalSearch",
    "LaunchRow",
    "LogicError",
    "LogicSettingsError",
    "Measurement",
    "Proposal",
    "SlotKey",
    "SnapshotError",
    "Strategy",
    "Tuner",
    "WindowSpec",
    "Windower",
    "WindowerMetrics",
    "aggregate_reference",
    "finding_id",
    "group_of",
    "launch_rows",
    "make_example_batch",
]
