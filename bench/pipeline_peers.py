"""``kernelstream bench pipeline-peers``: the worker beside peers a user would pick.

One run, one embedded broker, one pre-produced fleet input (:mod:`bench.pipeline_input`)
written twice, as JSON and in the binary layout (:mod:`schemas.binary`), same batches;
with ``--config-every S`` a tuning fleet's input, each kernel moving to another
configuration every S seconds.
Each round runs, one process at a time, on fresh consumer groups:

* ceiling JSON     aiokafka fetch + the worker's zstd decoder + ``orjson.loads``;
* ceiling binary   aiokafka fetch + the worker's zstd decoder (nothing to parse);
* worker JSON / worker binary   the real ``kernelstream worker``;
* Faust peer       :mod:`bench.peer_faust`: a Faust agent over the JSON batches, NumPy per
                   message;
* Faust peer binary   the same agent over the binary batches (the nodes' default wire),
                   its columns read with the project's own reader;
* Quix peer        :mod:`bench.peer_quix`: a Quix Streams application, tumbling windows
                   over one record per launch (``--quix-s`` caps its run);
* baseline JSON / baseline binary   with ``--baseline DIR``, the worker of another
                   source tree (a checkout of another commit) in the same rounds: an A/B
                   of a change on the same broker and input, its ratio paired by round.
                   The two workers take turns going first (this tree's in even rounds,
                   the baseline's in odd ones): on the embedded broker the worker that
                   runs second in a round read faster, 0.95x one way and 1.27x the
                   other for the same pair (bench/results/
                   pipeline-peers-small-written-from-start-2026-11-29.txt, ``-swapped``).

Every system computes count, mean and p95 of the durations per (stream, config, 1 s
window). Their closed windows are checked against a reference computed from the input
batches with NumPy: a window matches when its count is equal and mean and p95 agree to
1e-9 relative. Rates are each process's launches over its own time from the start of
the consumer poll that returned its first messages to its last batch; each process also
reads its own CPU clock (all its threads) at those two moments, so a rate per CPU second
is a rate per core whatever threads a system runs (Faust's consumer, a worker's
checkpoint writer). "cores" is CPU seconds per second. The clock starts before that first
poll, not at the first batch, because a poll decompresses everything it returns: a
consumer that takes a whole fetch at once (the ceilings, Faust's consumer thread) would
otherwise do much of its work before its clock started. For the Quix peer, whose
librdkafka consumer fetches and decompresses in its own threads from the moment it has
partitions, the clock starts at its partition assignment.

A worker does more than the window stage: its tuner and alert stages read every finding
its window agent publishes, and while launches are buffered the window agent holds the
event loop, so most of their work runs after the last batch. For the workers (and the
baseline, where its tree counts them) the benchmark also waits until the tuner and alert
stages have taken every finding and prints the rate per CPU second of every stage to then
(:func:`~bench.pipeline_procs.every_stage_done`), beside the window stage's. Every topic a
run writes or reads, but the input, is its own.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import click
import numpy as np
import orjson

from kernelstream.app.kafka.embedded import EmbeddedBroker, free_port
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.settings import Settings
from kernelstream.bench.pipeline_input import (
    FleetSpec,
    fleet_batches,
    node_cost,
    produce_messages,
    recent_t0,
)
from kernelstream.bench.pipeline_procs import (
    WorkerProc,
    bench_settings,
    every_stage_done,
    every_stage_figures,
    running,
)
from kernelstream.bench.results import dated_stem
from kernelstream.bench.worker_path import aggregates_pass, nonempty_windows, window_parts
from kernelstream.schemas import LaunchBatch, WindowAggregate, decode, encode
from kernelstream.schemas.binary import encode_launch_batch

__all__ = ["command", "compare_windows", "reference_windows"]

_Key = tuple[str, str, float]  # (stream, config_id, window_start)
# The topics a worker writes or reads besides the launches.
_DERIVED = ("windows", "findings", "recommendations", "reconfig", "late", "deadletter", "alerts")
_PEERS = {
    "faust_peer": "kernelstream.bench.peer_faust",
    "quix_peer": "kernelstream.bench.peer_quix",
}


def reference_windows(batches: list[LaunchBatch], size_s: float) -> dict[_Key, dict[str, float]]:
    """count, mean and p95 of the durations of launches that ran, per window, from the input."""
    out = {}
    for key, ds in window_parts(batches, size_s).items():
        d = np.concatenate(ds)
        if d.size:
            out[key] = {"count": d.size, "mean": d.mean(), "p95": np.percentile(d, 95)}
    return out


def compare_windows(
    got: list[dict[str, Any]], ref: dict[_Key, dict[str, float]], rel: float = 1e-9
) -> dict[str, Any]:
    """How a system's closed windows agree with the reference (see the module's doc)."""
    seen: set[_Key] = set()
    bad: list[dict[str, Any]] = []
    for w in got:
        key = (w["stream"], w["config_id"], float(w["window_start"]))
        want = ref.get(key)
        ok = (
            want is not None
            and key not in seen
            and w["count"] == want["count"]
            and all(abs(w[f] - want[f]) <= rel * abs(want[f]) for f in ("mean", "p95"))
        )
        seen.add(key)
        if not ok:
            bad.append({"got": w, "want": want})
    return {
        "windows": len(got),
        "matching": len(got) - len(bad),
        "differing": len(bad),
        "not_closed": len(set(ref) - seen),
        "examples": bad[:3],
        "equal": not bad,
    }


async def _ceiling(bootstrap: str, topic: str, n_msgs: int, binary: bool) -> dict[str, Any]:
    """Fetch + the worker's zstd decoder (+ orjson.loads for JSON) of every message."""
    from aiokafka import AIOKafkaConsumer

    from kernelstream.app.kafka import zstd_decode

    zstd_decode.install()
    c = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=4 << 20,
        fetch_max_bytes=16 << 20,
    )
    await c.start()
    got = launches = 0
    t0 = t1 = cpu0 = cpu1 = 0.0
    try:
        while got < n_msgs:
            # from the start of the poll that returns the first messages: it decompressed them
            polled = time.perf_counter(), time.process_time()
            for msgs in (await c.getmany(timeout_ms=1000)).values():
                if not t0:
                    t0, cpu0 = polled
                for m in msgs:
                    v = m.value
                    launches += (
                        int.from_bytes(v[8:12], "little")
                        if binary
                        else len(orjson.loads(v)["t_end"])
                    )
                    got += 1
                t1, cpu1 = time.perf_counter(), time.process_time()
    finally:
        await c.stop()
        zstd_decode.uninstall()
    return {
        "launches": launches,
        "seconds": t1 - t0,
        "per_s": launches / (t1 - t0),
        "cpu_s": cpu1 - cpu0,
        "per_cpu_s": launches / (cpu1 - cpu0),
    }


async def _kernelstream_windows(s: Settings) -> list[dict[str, Any]]:
    """The worker's closed windows, read back from its windows topic."""
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(
        s.topic_windows, bootstrap_servers=s.bootstrap, auto_offset_reset="earliest"
    )
    await c.start()
    out: list[dict[str, Any]] = []
    try:
        idle = 0
        while idle < 3:
            batch = await c.getmany(timeout_ms=1000)
            idle = 0 if batch else idle + 1
            for msgs in batch.values():
                for m in msgs:
                    w = decode(m.value, WindowAggregate)
                    out.append(
                        {
                            "stream": f"{w.node}:{w.device_index}/{w.kernel}",
                            "config_id": w.config_id,
                            "window_start": w.window_start,
                            "count": w.count,
                            "mean": w.duration_mean_us,
                            "p95": w.duration_p95_us,
                        }
                    )
    finally:
        await c.stop()
    return out


async def _system(
    s: Settings, log: Path, n: int, module: str | None, cap_s: float, source: Path | None = None
) -> dict[str, Any]:
    """Run one system until it has all ``n`` launches (or ``cap_s``), then its windows."""
    argv = [sys.executable, "-m", module] if module else None
    w = WorkerProc(s, log, argv, source)
    done: dict[str, float] = {}
    with running(w):
        st = await w.wait_stats(
            lambda st: (
                st["window"]["launches"] >= n
                or (
                    st["window"]["first_batch_at"] is not None
                    and time.time() - st["window"]["first_batch_at"] > cap_s
                )
            ),
            cap_s + 120,
            "launches",
            every_s=0.5,
        )
        if module is None:
            done = await every_stage_done(w, st["window"]["last_batch_at"])
        await asyncio.sleep(s.idle_timeout_s + 2.0)  # idle streams' last windows close
        windows = (
            await _kernelstream_windows(s)
            if module is None
            else await asyncio.to_thread(_fetch_windows, s.web_port)
        )
    win = st["window"]
    # From the start of the consumer poll that returned the first messages (it
    # decompressed them) to the last batch, the process's own CPU clock over the same
    # span (all its threads: a rate per core).
    seconds = win["last_batch_at"] - win["first_poll_at"]
    cpu_s = win["cpu_at_last_batch"] - win["cpu_at_first_poll"]
    return {
        "launches": win["launches"],
        "seconds": seconds,
        "per_s": win["launches"] / seconds,
        "cpu_s": cpu_s,
        "per_cpu_s": win["launches"] / cpu_s,
        "complete": win["launches"] >= n,
        "load_avg": os.getloadavg(),
        "stage_s": win.get("stage_s"),
        "polls": win.get("polls"),
        "polled_messages": win.get("polled_messages"),
        "batches": win.get("batches"),
        "compiled_batches": win.get("compiled_batches"),
        "compiled_stops": win.get("compiled_stops"),
        "windows": win.get("windows"),
        "written_windows": win.get("written_windows"),
        **every_stage_figures(win, done),
        "_windows": windows,
    }


_IDLE_S = 5.0  # idle seconds measured before the scale-out input is produced


async def _scale_out(
    broker: EmbeddedBroker,
    items: list[tuple[bytes, bytes]],
    n: int,
    k: int,
    run_dir: Path,
    busy_loop: bool = False,
    separate: bool = False,
) -> dict[str, Any]:
    """``k`` workers in one group: each one's rate and the group's CPU per launch.

    The input is produced only once every worker has its partitions, so the CPU counted
    (user + system of the worker processes, from then until the last launch) is the
    launches' and not the start-up's. It still includes what the processes spend with
    nothing to do (timers, heartbeats, empty fetches, and the half second between two
    looks at their stats), which k workers pay k times over: measured first, idle, for
    ``_IDLE_S``, it is also taken off for a marginal CPU per launch.

    ``busy_loop``: a process spinning in a busy loop runs beside the workers throughout,
    the control for k workers: what sharing the machine's cores with anything costs a
    worker per launch, with no second worker in its group.

    ``separate``: the control for the group itself: each of the ``k`` workers has its own
    topic and group and the whole input on it (k times the launches, produced to the k
    topics at once), so the workers share the machine as k workers of one group do and
    each receives launches at the rate a member of one group does (the producers share
    the cores too), but no group spreads a topic's partitions over them.
    """
    import psutil

    s = bench_settings(broker.bootstrap, run_dir / "state", window_s=1.0)
    groups = [
        bench_settings(broker.bootstrap, run_dir / "state", window_s=1.0) if i else s
        for i in range(k if separate else 1)
    ]
    for g in groups:
        await ensure_topics(g, broker.bootstrap)
    for i in range(k):
        (s.data_dir / f"w{i}").mkdir(parents=True, exist_ok=True)
    procs = [
        WorkerProc(
            groups[i if separate else 0].model_copy(
                update={"web_port": free_port(), "data_dir": s.data_dir / f"w{i}"}
            ),
            run_dir / f"scale-{k}-{i}{'-separate' if separate else ''}.log",
        )
        for i in range(k)
    ]
    n *= len(groups)
    spin = (
        await asyncio.create_subprocess_exec(sys.executable, "-c", "while True: pass")
        if busy_loop
        else None
    )
    try:
        for w in procs:
            w.start()
        for w in procs:
            try:
                await w.wait_stats(
                    lambda st: st["window"].get("assigned_at") is not None, 120, "join"
                )
            except RuntimeError as ex:
                tail = w.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{ex}; its log ends:\n{tail}") from ex
        await asyncio.sleep(s.session_timeout_s)  # the group's last rebalance settles
        ps = [psutil.Process(w.proc.pid) for w in procs if w.proc is not None]
        # What the workers cost with nothing to do (timers, heartbeats, empty fetches):
        # a fixed cost per process and second, which k processes pay k times.
        idle0, t_idle = sum(sum(p.cpu_times()[:2]) for p in ps), time.monotonic()
        await asyncio.sleep(_IDLE_S)
        cpu0, t0 = sum(sum(p.cpu_times()[:2]) for p in ps), time.monotonic()
        idle_cpu_per_s = (cpu0 - idle0) / (t0 - t_idle)
        # one producer per topic, all at once: each separate worker gets its input at the
        # rate a worker of one group gets its share
        await asyncio.gather(
            *(
                produce_messages(
                    broker.bootstrap,
                    g.topic_launches,
                    items,
                    compression_type=s.producer_compression(),
                )
                for g in groups
            )
        )
        deadline = time.monotonic() + 600
        while True:
            stats = [await asyncio.to_thread(w.stats) for w in procs]
            done = sum(st["window"]["launches"] for st in stats if st)
            if done >= n or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        cpu1, t1 = sum(sum(p.cpu_times()[:2]) for p in ps), time.monotonic()
    finally:
        for w in procs:
            w.stop()
        if spin is not None:
            spin.kill()
            await spin.wait()
    per_worker = []
    for st in stats:
        win = (st or {}).get("window") or {}
        span = (win.get("last_batch_at") or 0) - (win.get("first_batch_at") or 0)
        got = win.get("launches", 0)
        per_worker.append(
            {
                "launches": got,
                "per_s": got / span if span > 0 else 0.0,
                "messages_per_poll": win.get("polled_messages", 0) / max(win.get("polls", 0), 1),
            }
        )
    return {
        "workers": k,
        "busy_loop": busy_loop,
        "separate": separate,
        "launches": done,
        "per_worker": per_worker,
        "cpu_s": cpu1 - cpu0,
        "cpu_ns_per_launch": (cpu1 - cpu0) / max(done, 1) * 1e9,
        "wall_s": t1 - t0,
        "idle_cpu_per_s": idle_cpu_per_s,
        # CPU per launch beyond what the same processes spend idle over the same time
        "marginal_cpu_ns_per_launch": (cpu1 - cpu0 - idle_cpu_per_s * (t1 - t0))
        / max(done, 1)
        * 1e9,
        "load_avg": os.getloadavg(),
    }


def _fetch_windows(port: int) -> list[dict[str, Any]]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ks/windows/", timeout=30) as r:
        return list(orjson.loads(r.read()))


_ENCODERS = (("json", encode), ("binary", encode_launch_batch))


async def _bench(opts: dict[str, Any], run_dir: Path, broker: EmbeddedBroker) -> dict[str, Any]:
    fleet = FleetSpec(
        nodes=opts["nodes"],
        launches_per_s_per_kernel=opts["rate_per_kernel"],
        seconds=opts["input_s"],
        max_launches=opts["batch"],
        t0=recent_t0(opts["input_s"] + 60),
        config_every_s=opts.get("config_every"),
    )
    batches = list(fleet_batches(fleet))
    n = sum(len(b.t_end) for b in batches)
    topics: dict[str, Settings] = {}
    for wire, enc in _ENCODERS:
        s = bench_settings(broker.bootstrap, run_dir / "state", window_s=1.0)
        await ensure_topics(s, broker.bootstrap)
        items = [(b.stream_key.encode(), enc(b)) for b in batches]
        await produce_messages(
            broker.bootstrap, s.topic_launches, items, compression_type=s.producer_compression()
        )
        topics[wire] = s
    ref = reference_windows(batches, 1.0)
    out: dict[str, Any] = {
        "node": node_cost(fleet),
        "date": dt.date.today().isoformat(),
        "load_avg_start": os.getloadavg(),
        "input": {
            "fleet": fleet.__dict__,
            "messages": len(batches),
            "launches": n,
            "launches_per_message_mean": n / len(batches),
            "reference_windows": len(ref),
            "series": len({(b.stream_key, b.config_id) for b in batches}),
        },
    }
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    parts = nonempty_windows(batches, 1.0)
    for r in range(opts["rounds"]):
        for wire, s in topics.items():
            rows[f"ceiling_{wire}"].append(
                await _ceiling(broker.bootstrap, s.topic_launches, len(batches), wire == "binary")
            )
        # What bounds any worker of these windows: their exact aggregates alone, timed here
        # (in this process, the parts grouped beforehand) in the same rounds as the ceilings.
        t0 = time.perf_counter()
        aggregates_pass(parts)
        seconds = time.perf_counter() - t0
        rows["aggregates"].append({"seconds": seconds, "per_s": n / seconds})
        runs: list[tuple[str, Settings, str | None, float]] = [
            ("worker_json", topics["json"], None, 600.0),
            ("worker_binary", topics["binary"], None, 600.0),
        ]
        if opts["baseline"] is not None:
            both: list[tuple[str, Settings, str | None, float]] = [
                ("baseline_json", topics["json"], None, 600.0),
                ("baseline_binary", topics["binary"], None, 600.0),
            ]
            runs = runs + both if r % 2 == 0 else both + runs  # turns at going first
        if opts["peers"]:
            runs.append(("faust_peer", topics["json"], _PEERS["faust_peer"], 600.0))
            runs.append(("faust_peer_binary", topics["binary"], _PEERS["faust_peer"], 600.0))
        if opts["peers"] and opts["quix_s"] > 0:
            runs.append(("quix_peer", topics["json"], _PEERS["quix_peer"], opts["quix_s"]))
        for name, base, module, cap in runs:
            source = opts["baseline"] if name.startswith("baseline") else None
            # Every topic but the input is the run's own: a worker's Faust agents read
            # their topics from the earliest offset, and on shared ones each run read
            # every earlier run's findings as well as its own.
            s = base.model_copy(
                update={
                    "app_id": f"{base.app_id}-{name}-r{r}",
                    "web_port": free_port(),
                    **{
                        f"topic_{role}": f"{getattr(base, f'topic_{role}')}-{name}-r{r}"
                        for role in _DERIVED
                    },
                }
            )
            if module is None:
                await ensure_topics(s, broker.bootstrap)
            res = await _system(s, run_dir / f"{name}-{r}.log", n, module, cap, source)
            res["check"] = compare_windows(res.pop("_windows"), ref)
            rows[name].append(res)
            click.echo(f"round {r}: {name} {res['per_s']:,.0f}/s {res['check']}", err=True)
    for name, rounds in rows.items():
        rates = [x["per_s"] for x in rounds]
        out[name] = {"median_per_s": statistics.median(rates), "rounds": rounds}
    if opts["workers"] > 1:
        items = [(b.stream_key.encode(), encode_launch_batch(b)) for b in batches]
        out["scale_out"] = [
            await _scale_out(broker, items, n, k, run_dir, busy, separate)
            for k, busy, separate in (
                (1, False, False),
                (1, True, False),
                (opts["workers"], False, False),
                (opts["workers"], False, True),
            )
        ]
    out["load_avg_end"] = os.getloadavg()
    return out


def _per_cpu(row: dict[str, Any]) -> float:
    """Median launches per CPU second of a system's rounds (0 for results without it)."""
    rounds = row["rounds"]
    if not all("per_cpu_s" in x for x in rounds):
        return 0.0
    return float(statistics.median(x["per_cpu_s"] for x in rounds))


def _stage_lines(r: dict[str, Any], ceil: dict[str, float]) -> list[str]:
    """Where each worker's window stage spent its time, per message and per window, beside
    what the ceiling of its input spends per message: the gap to the ceiling by stage.

    Stages as the window agent clocks them (``WindowAgentStats.stage_s``, wall time,
    medians of the rounds); fetch, emit and checkpoint await, so they include what the
    worker's other tasks ran meanwhile.
    """
    inp = r["input"]
    messages, windows = inp["messages"], max(1, inp["reference_windows"])
    out = []
    for name in ("worker_json", "worker_binary"):
        rounds = [x for x in r.get(name, {}).get("rounds", []) if x.get("stage_s")]
        wire = "binary" if name.endswith("binary") else "json"
        if not rounds or wire not in ceil:
            continue
        steps = rounds[0]["stage_s"]
        stage = {k: statistics.median(x["stage_s"][k] for x in rounds) for k in steps}
        per_msg = ", ".join(f"{k} {v / messages * 1e6:.1f}" for k, v in stage.items())
        per_win = ", ".join(
            f"{k} {stage[k] / windows * 1e6:.0f}" for k in ("close", "emit") if k in stage
        )
        ceiling_us = inp["launches"] / ceil[wire] / messages * 1e6
        # the worker's whole time per message (its median rate); what the steps leave of
        # it ran between them: the findings reader and its stages, the producer's sends,
        # the fetcher's requests, the event loop
        total_us = inp["launches"] / r[name]["median_per_s"] / messages * 1e6
        between = total_us - sum(stage.values()) / messages * 1e6
        engine = ""
        last = rounds[-1]
        if last.get("batches"):
            stops = ", ".join(f"{k} {v}" for k, v in sorted((last["compiled_stops"] or {}).items()))
            engine = (
                f"; the compiled engine windowed {last['compiled_batches']:,} of "
                f"{last['batches']:,} batches (last round; the messages it stopped at, by reason: "
                f"{stops or 'none'})"
            )
            if last.get("written_windows") is not None and last.get("windows"):
                engine += (
                    f" and wrote {last['written_windows']:,} of its {last['windows']:,} "
                    "windows with their findings"
                )
        out.append(
            f"{name}, window stage by step, us per message: {per_msg}, between the steps "
            f"{between:.1f}; {total_us:.1f} in all (per window: {per_win}); "
            f"the {wire} ceiling: {ceiling_us:.1f} us per message in all{engine}"
        )
    return out


def _table(r: dict[str, Any]) -> str:
    inp = r["input"]
    lines = [
        f"input: {inp['launches']:,} launches in {inp['messages']:,} messages "
        f"({inp['launches_per_message_mean']:.0f} per message"
        + (f"; {inp['series']:,} series" if "series" in inp else "")
        + f"), {inp['reference_windows']} reference windows; load average "
        f"{r['load_avg_start'][0]:.1f} -> {r['load_avg_end'][0]:.1f}",
        f"{'system':<18}{'launches/s':>14}  {'rounds':<22}{'cores':>6}{'per CPU-s':>14}"
        f"{'vs ceiling':>11}  windows check",
    ]
    ceil = {w: r[f"ceiling_{w}"]["median_per_s"] for w in ("json", "binary") if f"ceiling_{w}" in r}
    for name in (
        "ceiling_json",
        "ceiling_binary",
        "worker_json",
        "worker_binary",
        "baseline_json",
        "baseline_binary",
        "faust_peer",
        "faust_peer_binary",
        "quix_peer",
    ):
        if name not in r:
            continue
        rounds = [x["per_s"] for x in r[name]["rounds"]]
        med = r[name]["median_per_s"]
        wire = "binary" if name.endswith("binary") else "json"
        span = f"{min(rounds) / 1e6:.2f}M-{max(rounds) / 1e6:.2f}M"
        # CPU seconds per second (0 for results without CPU clocks)
        cores = statistics.median(x.get("cpu_s", 0.0) / x["seconds"] for x in r[name]["rounds"])
        check = ""
        if "check" in r[name]["rounds"][-1]:
            c = r[name]["rounds"][-1]["check"]
            check = (
                f"{'equal' if c['equal'] else 'DIFFERENT'}: {c['matching']}/{c['windows']} "
                f"match, {c['not_closed']} not closed"
            )
        lines.append(
            f"{name:<18}{med:>14,.0f}  {span:<22}{cores:>6.2f}{_per_cpu(r[name]):>14,.0f}"
            f"{med / ceil[wire]:>11.2f}  {check}"
        )
    if "aggregates" in r and "ceiling_binary" in r:
        agg_ns = 1e9 / r["aggregates"]["median_per_s"]
        bound = {w: 1e9 / c / (1e9 / c + agg_ns) for w, c in ceil.items()}
        lines.append(
            f"exact aggregates alone (count, mean, p95 per window, grouped beforehand, one "
            f"process): {agg_ns:.1f} ns/launch; a worker doing nothing else would reach "
            f"{bound['binary']:.2f} of the binary ceiling and {bound['json']:.2f} of the JSON one"
        )
    lines += _stage_lines(r, ceil)
    for name in ("worker_json", "worker_binary", "baseline_json", "baseline_binary"):
        rounds = r.get(name, {}).get("rounds", [])
        if rounds and all("every_stage_per_cpu_s" in x for x in rounds):
            per_cpu = statistics.median(x["every_stage_per_cpu_s"] for x in rounds)
            after = statistics.median(x["every_stage_cpu_s"] - x["cpu_s"] for x in rounds)
            lines.append(
                f"{name}, every stage (until the tuner and alert stages have taken every "
                "finding): "
                f"{per_cpu:,.0f} launches per CPU second, "
                f"{_per_cpu(r[name]) / per_cpu:.2f}x the window stage's figure above; "
                f"{after:.2f} CPU-s after the last batch"
            )
    for wire, peers in (("json", ("faust_peer", "quix_peer")), ("binary", ("faust_peer_binary",))):
        best = max((r[p]["median_per_s"] for p in peers if p in r), default=0.0)
        best_cpu = max((_per_cpu(r[p]) for p in peers if p in r), default=0.0)
        if best and f"worker_{wire}" in r:
            lines.append(
                f"worker / best peer on the same {wire} messages = "
                f"{r[f'worker_{wire}']['median_per_s'] / best:.2f} per second, "
                f"{_per_cpu(r[f'worker_{wire}']) / best_cpu:.2f} per CPU second"
            )
    for wire in ("json", "binary"):
        if f"baseline_{wire}" in r:
            paired = [
                a["per_s"] / b["per_s"]
                for a, b in zip(
                    r[f"worker_{wire}"]["rounds"], r[f"baseline_{wire}"]["rounds"], strict=True
                )
            ]
            lines.append(
                f"worker / baseline, {wire} input: median of rounds "
                f"{statistics.median(paired):.2f} ({min(paired):.2f}-{max(paired):.2f})"
            )
            pairs = zip(r[f"worker_{wire}"]["rounds"], r[f"baseline_{wire}"]["rounds"], strict=True)
            every = [
                a["every_stage_per_cpu_s"] / b["every_stage_per_cpu_s"]
                for a, b in pairs
                if "every_stage_per_cpu_s" in a and "every_stage_per_cpu_s" in b
            ]
            if every:
                lines.append(
                    f"worker / baseline, {wire} input, every stage per CPU second: median of "
                    f"rounds {statistics.median(every):.2f} ({min(every):.2f}-{max(every):.2f})"
                )
    node = r.get("node")
    for wire, e in (node or {}).get("encode", {}).items():
        lines.append(
            f"node encode {wire:<7}{e['ns_per_launch']:6.0f} ns/launch, "
            f"{e['bytes_per_launch']:.1f} bytes ({e['zstd_bytes_per_launch']:.1f} zstd) per launch"
        )
    if node:
        lines.append(
            f"node batching        {node['batch_ns_per_launch']:6.0f} ns/launch "
            f"({node['batches']:,} batches of {node['launches'] / node['batches']:.0f} launches "
            "from the device's arrays), before encoding"
        )
        through = node.get("binary_through_record_ns_per_launch")
        if through:
            binary = node["encode"]["binary"]["ns_per_launch"]
            lines.append(
                f"node encode binary through the validated record {through:.0f} ns/launch: "
                f"{through / binary:.1f}x the node's own path"
            )
    for so in r.get("scale_out", []):
        rates = ", ".join(f"{w['per_s'] / 1e6:.2f}M" for w in so["per_worker"])
        beside = " beside a busy loop" if so.get("busy_loop") else ""
        groups = (
            "each in its own group, each the whole input" if so.get("separate") else "in one group"
        )
        per_poll = ", ".join(f"{w.get('messages_per_poll', 0):.0f}" for w in so["per_worker"])
        lines.append(
            f"{so['workers']} worker(s){beside} {groups}: {so['launches']:,} launches, "
            "per worker "
            f"{rates} launches/s ({per_poll} messages per poll), "
            f"CPU {so['cpu_ns_per_launch']:.0f} ns per launch"
            + (
                f" ({so['marginal_cpu_ns_per_launch']:.0f} beyond the "
                f"{so['idle_cpu_per_s'] * 1e3:.0f} ms/s the workers spend idle, over "
                f"{so['wall_s']:.1f} s)"
                if "idle_cpu_per_s" in so
                else ""
            )
        )
    return "\n".join(lines)


@click.command("pipeline-peers")
@click.option("--input-s", type=float, default=4.0, show_default=True, help="Seconds of input.")
@click.option("--batch", type=int, default=2000, show_default=True, help="Launches per batch.")
@click.option("--nodes", type=int, default=16, show_default=True)
@click.option("--rate-per-kernel", type=float, default=20_000.0, show_default=True)
@click.option(
    "--config-every",
    type=float,
    default=None,
    help="Seconds of input between each kernel's moves to another configuration (a "
    "tuning fleet's input: each move starts a series).",
)
@click.option("--rounds", type=int, default=3, show_default=True)
@click.option("--quix-s", type=float, default=60.0, show_default=True, help="0: no Quix peer.")
@click.option(
    "--workers",
    type=int,
    default=1,
    show_default=True,
    help="N > 1: also 1 and N workers in one group (binary input), 1 beside a busy loop "
    "(the cost of sharing the cores), and N each in its own group with the whole input "
    "(the cost of the group): rates and CPU per launch.",
)
@click.option(
    "--baseline",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Also run the worker of this source tree (a checkout of another commit) in "
    "every round, beside this one's: an A/B on the same input.",
)
@click.option(
    "--peers/--no-peers", default=True, show_default=True, help="Run the Faust and Quix peers."
)
@click.option("--name", default="peers", show_default=True, help="Results file name.")
@click.option("--results-dir", type=click.Path(path_type=Path), default=Path("bench/results"))
def command(**opts: Any) -> None:
    """Worker (JSON and binary input) vs its ceilings, a Faust peer and a Quix Streams peer."""
    results_dir = opts.pop("results_dir")
    with (
        tempfile.TemporaryDirectory(prefix="ks-peers-") as tmp,
        EmbeddedBroker(Path(tmp)) as broker,
    ):
        result = asyncio.run(_bench(opts, Path(tmp), broker))
    result["options"] = opts
    table = _table(result)
    click.echo(table)
    stem = dated_stem(results_dir, opts["name"], result["date"])
    Path(f"{stem}.json").write_text(json.dumps(result, indent=1, default=str))
    Path(f"{stem}.txt").write_text(table + "\n")
    click.echo(f"wrote {stem}.json and {stem}.txt", err=True)
