# Types of the compiled module built from native/ (see kernelstream.schemas.native).
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

class SteadyWindows:
    def __init__(
        self,
        size_s: float,
        out_of_orderness_s: float,
        allowed_lateness_s: float,
        max_age_s: float,
        max_future_s: float,
        max_duration_bits: int,
    ) -> None: ...
    def register(self, header: bytes, stream_key: str, config_id: str) -> None: ...
    @staticmethod
    def header_of(value: bytes) -> bytes | None: ...
    def poll(
        self, values: list[bytes], now: float
    ) -> list[tuple[str, int, int, float, float, float, float, float, float, float]]: ...
