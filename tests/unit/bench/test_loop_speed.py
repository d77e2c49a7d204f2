"""``bench loop-speed`` reads the loop's timeline off a demo recording."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson

from kernelstream.bench.loop_speed import analyse


def _write(directory: Path, topic: str, values: list[tuple[float, dict[str, Any]]]) -> None:
    lines = [
        orjson.dumps(
            {
                "p": 0,
                "o": i,
                "ts": round(at * 1000),
                "k": None,
                "v": base64.b64encode(orjson.dumps(v)).decode(),
            }
        )
        for i, (at, v) in enumerate(values)
    ]
    (directory / f"{topic}.jsonl").write_bytes(b"\n".join(lines) + b"\n")


def test_first_recommendations_refusals_and_host_changes_kept(tmp_path: Path) -> None:
    def finding(node: str, kernel: str, start: float) -> dict[str, Any]:
        return {"node": node, "kernel": kernel, "window_start": start, "window_end": start + 1}

    _write(
        tmp_path,
        "ks.findings",
        [(101.1, finding("a", "k", 100.0)), (102.1, finding("b", "k", 101.0))],
    )
    _write(
        tmp_path,
        "ks.recommendations",
        [(104.0, {"node": "a", "kernel": "k"}), (110.0, {"node": "a", "kernel": "k"})],
    )
    pinned = {"before_config": {"pinned": 0}, "after_config": {"pinned": 1}}
    _write(
        tmp_path,
        "ks.reconfig",
        [
            (105.0, {"node": "a", "kernel": "k", "status": "applied", "at": 105.0, **pinned}),
            (107.5, {"node": "a", "kernel": "k", "status": "kept", "at": 107.5, **pinned}),
            (
                111.0,
                {
                    "node": "a",
                    "kernel": "k",
                    "status": "rejected",
                    "reject_code": "busy",
                    "at": 111.0,
                }
                | pinned,
            ),
        ],
    )
    got = analyse(tmp_path)
    assert got["streams"] == 2 and got["streams_with_a_recommendation"] == 1
    assert got["first_recommendation_s"] == {"median": 3.0, "max": 3.0}  # 104 - 101
    assert got["recommendations"] == 2
    assert got["outcomes"] == {"applied": 1, "kept": 1, "rejected": 1}
    assert got["refusals"] == {"busy": 1}
    assert got["host_changes_kept_s"] == {"a/k/pinned 0 -> 1": 7.5}  # from the first window
