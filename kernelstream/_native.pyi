# Types of the compiled module built from native/ (see kernelstream.schemas.native).
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

def window_stats(
    t_chunks: list[npt.NDArray[np.float64]],
    d_chunks: list[npt.NDArray[np.float64]],
    qs: list[float],
) -> tuple[int, float, float, float, float, list[float], float, float] | None: ...
def plain_many(
    t: list[npt.NDArray[np.float64]],
    d: list[npt.NDArray[np.float64]],
    ok: list[npt.NDArray[np.uint8]],
    max_duration_bits: int,
) -> list[tuple[tuple[float, float], bool, bool] | None]: ...

_F64 = npt.NDArray[np.float64]
# (window, config id, meta index, end times, durations, failures, late accepted, seq min,
# seq max)
_Window = tuple[int, str, int, _F64, _F64, int, int, int, int]
# (max t, last seen, closed below, seq hi, open windows)
_State = tuple[float, float, int | None, int, list[_Window]]
# (stream key, window, config id, meta index, failures, late accepted, seq min, seq max,
# (count, total, mean, std, idle gap, p50, p95, min, max) or None, columns where None)
_Row = tuple[
    str,
    int,
    str,
    int,
    int,
    int,
    int,
    int,
    tuple[int, float, float, float, float, float, float, float, float] | None,
    tuple[_F64, _F64] | None,
]

# A window of a series the engine writes (write_as): (stream key, window record, group
# key, classification, finding, window end, launches, and where the window fed its
# series' regression baseline, its key and the baseline after it)
_WrittenRow = tuple[bytes, bytes, bytes, str, bytes, float, int, tuple[str, int, int, float] | None]

class WindowEngine:
    def __init__(
        self,
        size_s: float,
        out_of_orderness_s: float,
        allowed_lateness_s: float,
        max_duration_bits: int,
    ) -> None: ...
    @staticmethod
    def header_of(value: bytes) -> bytes | None: ...
    def register(
        self, header: bytes, key: bytes | None, stream_key: str, config_id: str, meta: int
    ) -> None: ...
    def holds(self, stream_key: str) -> bool: ...
    def held(self) -> list[str]: ...
    def last_seen(self) -> list[tuple[str, float]]: ...
    def open_windows(self) -> int: ...
    def adopt(
        self,
        stream_key: str,
        max_t: float,
        last_seen: float,
        closed_below: int | None,
        seq_hi: int,
        windows: list[_Window],
    ) -> None: ...
    def release(self, stream_key: str) -> _State | None: ...
    def export(self, stream_key: str) -> _State | None: ...
    def unregistered(
        self, values: list[bytes | None], keys: list[bytes | None], start: int
    ) -> list[int]: ...
    def poll(
        self,
        values: list[bytes | None],
        keys: list[bytes | None],
        start: int,
        now: float,
        oldest: float,
        newest: float,
        max_bytes: int,
    ) -> tuple[int, int, list[_Row | _WrittenRow], str | None]: ...
    def write_as(
        self, stream_key: str, meta: int, config_id: str, writer: SeriesWriter
    ) -> bool: ...
    def retain_metas(self, keep: list[int]) -> list[int]: ...
    def writes(self, stream_key: str, config_id: str) -> bool: ...
    def writing(self) -> int: ...

# (literal, escaped for a JSON string; field code; format code; precision)
_Template = list[tuple[bytes, int, int, int]]

class Rules:
    def __init__(
        self,
        *,
        templates: list[tuple[str, _Template]],
        balanced: _Template,
        busy_cause: _Template,
        thresholds: Mapping[str, float],  # DetectorThresholds' fields
        plus_exponent: bool,
        window_markers: list[tuple[bytes, bytes]],
    ) -> None: ...

class SeriesWriter:
    def __init__(
        self,
        *,
        key: bytes,
        group: bytes,
        rules: Rules,
        window: bytes,
        roofline: tuple[float, float, float, float, float, float, float, float, float],
        finding: tuple[bytes, bytes],
        names: tuple[bytes, bytes, bytes],
        static_causes: list[bytes],
        baseline: tuple[int, int, float],  # windows, launches, sum of durations
        baseline_key: str,
    ) -> None: ...
    @property
    def baseline(self) -> tuple[int, int, float]: ...
    def write(
        self,
        window: int,
        counts: tuple[int, int, int, int],
        stats: tuple[int, float, float, float, float, float, float, float, float],
    ) -> tuple[bytes, str, bytes] | None: ...
