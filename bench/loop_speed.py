"""``kernelstream bench loop-speed``: how soon the whole loop acts, from a user's run.

Runs ``kernelstream demo --scenario transfers`` (two sim nodes whose kernels run under
host patterns: pageable copies, a synchronization after every launch) for ``--duration``
seconds, with this source tree and, with ``--baseline``, another checkout one after the
other, then reads each run's recording and prints, side by side:

* how long after a stream's first window ended its first recommendation was on the broker
  (median and largest over the streams): the tuner's latency as a node sees it;
* recommendations sent and what the nodes did with them (refusals by ``reject_code``);
* when each host change the findings carry (pinned buffers, no synchronization after each
  launch) was kept, from the first window's start;
* the seconds ``kernelstream replay`` of that tree spends on the recording's analysis
  (windows, findings and the tuner over every finding: its ``run.json``).

The demo runs on the machine's wall clock with everything else on it, so its figures move
with the machine's load; the ratios compare two runs made minutes apart on one machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import orjson

from kernelstream.app.replay.command import RecordingSource

__all__ = ["analyse", "command"]

# What the transfers scenario's host findings change, and the change that fixes each.
_HOST_CHANGES = {"pinned": (0, 1), "sync_every": (1, 0)}


async def _values(directory: Path, topic: str) -> list[tuple[float, dict[str, Any]]]:
    """(broker time s, decoded value) of every message of ``topic`` in a recording."""
    source = RecordingSource(directory)
    out = []
    for p in await source.partitions(topic):
        lo, hi = await source.bounds(topic, p)
        async for msgs in source.read(topic, p, lo, hi):
            out += [(m.timestamp_ms / 1000.0, orjson.loads(m.value or b"{}")) for m in msgs]
    return sorted(out, key=lambda x: x[0])


def analyse(recording: Path) -> dict[str, Any]:
    """The loop's timeline in a demo recording (see the module docstring)."""

    async def read() -> tuple[list[Any], list[Any], list[Any]]:
        return (
            await _values(recording, "ks.findings"),
            await _values(recording, "ks.recommendations"),
            await _values(recording, "ks.reconfig"),
        )

    findings, recs, outcomes = asyncio.run(read())
    if not findings:
        return {"streams": 0}
    t0 = min(v["window_start"] for _, v in findings)
    first_window: dict[tuple[str, str], float] = {}
    for _, v in findings:
        first_window.setdefault((v["node"], v["kernel"]), v["window_end"])
    first_rec: dict[tuple[str, str], float] = {}
    for at, v in recs:
        first_rec.setdefault((v["node"], v["kernel"]), at)
    delays = sorted(at - first_window[k] for k, at in first_rec.items() if k in first_window)
    kept: dict[str, float] = {}
    for _, v in outcomes:
        if v["status"] != "kept":
            continue
        before, after = v["before_config"], v["after_config"]
        for knob, (old, new) in _HOST_CHANGES.items():
            if before.get(knob) == old and after.get(knob) == new:
                kept.setdefault(f"{v['node']}/{v['kernel']}/{knob} {old} -> {new}", v["at"] - t0)
    return {
        "streams": len(first_window),
        "streams_with_a_recommendation": len(first_rec),
        "first_recommendation_s": {
            "median": statistics.median(delays) if delays else None,
            "max": max(delays) if delays else None,
        },
        "recommendations": len(recs),
        "outcomes": dict(Counter(v["status"] for _, v in outcomes)),
        "refusals": dict(
            Counter(v.get("reject_code") or "-" for _, v in outcomes if v["status"] == "rejected")
        ),
        "host_changes_kept_s": dict(sorted(kept.items())),
    }


def _run(source: Path | None, duration: float, run_dir: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if source is not None:  # ``-m`` looks in the working directory first
        env["PYTHONPATH"] = str(source)
    cli = [sys.executable, "-m", "kernelstream.app.cli"]
    demo = [
        *cli,
        *("demo", "--scenario", "transfers", "--duration", str(duration), "--no-live"),
        *("--run-dir", str(run_dir)),
    ]
    started = time.time()
    done = subprocess.run(demo, env=env, cwd=source, capture_output=True, text=True)
    if done.returncode != 0:
        raise click.ClickException(f"the demo failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    out = analyse(run_dir / "recording")
    out["demo_wall_s"] = time.time() - started
    report = run_dir / "report"
    replay = [*cli, "replay", "--no-progress", "--recording", str(run_dir / "recording")]
    done = subprocess.run(
        [*replay, "--report", str(report)], env=env, cwd=source, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise click.ClickException(f"replay failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    run = json.loads((report / "run.json").read_text())
    out["replay_analysis_s"] = run["analysis_s"]
    out["replay_total_s"] = run["total_s"]
    return out


def _lines(name: str, r: dict[str, Any]) -> list[str]:
    first = r["first_recommendation_s"]
    lines = [
        f"{name}: {r['streams_with_a_recommendation']}/{r['streams']} streams recommended; "
        f"first recommendation {first['median']:.1f} s (median), {first['max']:.1f} s (max) "
        f"after the stream's first window; {r['recommendations']} recommendations, "
        f"outcomes {r['outcomes']}, refusals {r['refusals']}",
        f"{name}: replay of the recording: analysis {r['replay_analysis_s']:.1f} s "
        f"(total {r['replay_total_s']:.1f} s)",
    ]
    lines += [f"{name}:   kept {k} at {s:.1f} s" for k, s in r["host_changes_kept_s"].items()]
    return lines


@click.command("loop-speed")
@click.option("--duration", default=45.0, show_default=True, help="Seconds of demo per tree.")
@click.option(
    "--baseline",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Also run the demo and replay of this source tree (a checkout of another commit).",
)
@click.option("--name", default="loop-speed", show_default=True, help="Results file name.")
@click.option(
    "--results-dir",
    type=click.Path(path_type=Path),
    default=Path("bench/results"),
    show_default=True,
)
def command(duration: float, baseline: Path | None, name: str, results_dir: Path) -> None:
    """How soon the loop recommends and keeps host changes (transfers demo), and replay."""
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ks-loop-speed-") as tmp:
        for label, source in (("this", None), ("baseline", baseline)):
            if label == "baseline" and source is None:
                continue
            runs[label] = _run(source, duration, Path(tmp) / label)
            click.echo(f"{label}: demo and replay done")
    lines = [f"kernelstream bench loop-speed  {datetime.now(UTC).date()}  demo {duration:.0f} s"]
    for label, r in runs.items():
        lines += _lines(label, r)
    if "baseline" in runs:
        a, b = runs["this"], runs["baseline"]
        first = b["first_recommendation_s"]["median"] / a["first_recommendation_s"]["median"]
        lines.append(
            f"baseline / this: first recommendation (median) {first:.1f}x, "
            f"replay analysis {b['replay_analysis_s'] / a['replay_analysis_s']:.1f}x, "
            f"recommendations {a['recommendations'] / max(b['recommendations'], 1):.1f}x as many"
        )
    text = "\n".join(lines) + "\n"
    click.echo(text)
    results_dir.mkdir(parents=True, exist_ok=True)
    stem = results_dir / f"{name}-{datetime.now(UTC).date()}"
    stem.with_suffix(".txt").write_text(text)
    doc = {"date": str(datetime.now(UTC).date()), "duration_s": duration, "runs": runs}
    stem.with_suffix(".json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    click.echo(f"wrote {stem}.txt and {stem}.json")


if __name__ == "__main__":
    command()
