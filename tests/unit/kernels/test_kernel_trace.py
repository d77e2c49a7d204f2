"""Trace device: durations from measured times, failures, defaults, real cache files."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernelstream.kernels import TraceSpace, load_cache, open_device
from kernelstream.kernels.errors import TraceFileError


def _cache(path: Path, *, gz: bool = False, device: str = "NVIDIA A100-PCIE-40GB") -> Path:
    """A small convolution-like cache: 3x2 configs, one failed, one missing."""
    params = {
        "block_size_x": [16, 32, 64],
        "block_size_y": [1, 2],
        "filter_width": [15],
        "filter_height": [15],
    }
    cache: dict[str, Any] = {}
    for i, values in enumerate(itertools.product(*params.values())):
        rec: dict[str, Any] = dict(zip(params, values, strict=True))
        key = ",".join(str(v) for v in values)
        if values[:2] == (64, 2):
            continue  # never measured
        if values[:2] == (32, 2):
            rec.update(time="RuntimeFailedConfig")
        else:
            rec.update(time=1.0 + i, times=[1.0 + i, 1.1 + i, 0.9 + i])
        cache[key] = rec
    doc = {
        "device_name": device,
        "kernel_name": "convolution_kernel",
        "problem_size": [256, 128],
        "tune_params_keys": list(params),
        "tune_params": params,
        "objective": "time",
        "cache": cache,
    }
    if gz:
        with gzip.open(path, "wt") as fh:
            json.dump(doc, fh)
    else:
        path.write_text(json.dumps(doc))
    return path


def test_durations_come_from_times(tmp_path: Path) -> None:
    f = _cache(tmp_path / "conv.json.gz", gz=True)
    dev = open_device("trace", trace_file=f, seed=3)
    (w,) = dev.workloads()
    assert w.name == "convolution_kernel" and w.problem_size == (256, 128)
    assert dev.spec.name == "A100-PCIE-40GB"
    assert w.space.size() == 5  # 4 measured + 1 that failed when measured
    config = {"block_size_x": 32, "block_size_y": 1, "filter_width": 15, "filter_height": 15}
    r = dev.launch(w, config, 200)
    assert r.ok.all()
    assert set(np.round(r.duration_us, 6)) == {3000.0, 3100.0, 2900.0}  # config #2: 3.0 ms
    again = open_device("trace", trace_file=f, seed=3).launch(w, config, 200)
    np.testing.assert_array_equal(r.duration_us, again.duration_us)


def test_failed_and_missing_configs_fail(tmp_path: Path) -> None:
    dev = open_device("trace", trace_file=_cache(tmp_path / "c.json"))
    (w,) = dev.workloads()
    assert isinstance(w, TraceSpace)  # a trace device's workloads are its measured spaces
    base = {"filter_width": 15, "filter_height": 15}
    for bx, by in ((32, 2), (64, 2)):
        r = dev.launch(w, {"block_size_x": bx, "block_size_y": by, **base}, 4)
        assert not r.ok.any() and (r.duration_us == 0).all()
    assert dev.plan(w, {"block_size_x": 32, "block_size_y": 2, **base}).block == (32, 2, 1)
    assert "cannot" not in w.start_note and w.space.is_valid(w.default)


def test_kernel_tuners_old_failure_marker_reads_as_a_failure(tmp_path: Path) -> None:
    # Early Kernel Tuner releases stored ``time: 1e20`` for a config that failed to compile
    # or run; read as a number it would be a valid, very slow config.
    f = _cache(tmp_path / "old.json")
    doc = json.loads(f.read_text())
    doc["cache"]["32,2,15,15"]["time"] = 1e20
    f.write_text(json.dumps(doc))
    w = load_cache(f)
    config = {"block_size_x": 32, "block_size_y": 2, "filter_width": 15, "filter_height": 15}
    assert "old failure marker" in w.failed[w.space.config_id(config)]
    assert len(w.times_us) == 4 and w.space.is_valid(config)  # in the space, as KT has it
    assert not open_device("trace", trace_file=f).launch(w, config, 4).ok.any()


def test_times_no_launch_can_take_read_as_failures(tmp_path: Path) -> None:
    # A negative time, one over an hour (the longest launch a batch may carry) and a run
    # list with a broken entry: a node replaying them would send launches the schema
    # refuses, so they are failures, or the entry's mean, with the reason said.
    f = _cache(tmp_path / "odd.json")
    doc = json.loads(f.read_text())
    doc["cache"]["16,1,15,15"].update(time=-2.0, times=[-2.0, -2.0, -2.0])
    doc["cache"]["16,2,15,15"].update(time=4e6, times=[4e6] * 3)  # 67 minutes, in ms
    doc["cache"]["32,1,15,15"]["times"] = [3.0, float("nan"), 3.2]
    f.write_text(json.dumps(doc))
    w = load_cache(f)
    base = {"filter_width": 15, "filter_height": 15}

    def cid(bx: int, by: int) -> str:
        return w.space.config_id({"block_size_x": bx, "block_size_y": by, **base})

    assert "time -2.0 ms is not a measurement" in w.failed[cid(16, 1)]
    assert "over an hour" in w.failed[cid(16, 2)]
    assert w.times_us[cid(32, 1)].tolist() == [3000.0]  # the entry's mean time
    dev = open_device("trace", trace_file=f)
    r = dev.launch(w, {"block_size_x": 16, "block_size_y": 1, **base}, 4)
    assert not r.ok.any() and (r.duration_us == 0).all()


def test_models_and_geometry(tmp_path: Path) -> None:
    w = load_cache(_cache(tmp_path / "c.json"))
    c = w.default
    assert w.flops(c) == 2 * 256 * 128 * 15 * 15
    assert w.bytes_moved(c) == 4 * ((256 + 14) * (128 + 14) + 256 * 128 + 225)
    assert w.geometry(c).grid == (256 // int(c["block_size_x"]), 128 // int(c["block_size_y"]), 1)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(TraceFileError):
        load_cache(tmp_path / "absent.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(TraceFileError):
        load_cache(tmp_path / "x.json")
    with pytest.raises(TraceFileError, match="different GPUs"):
        open_device(
            "trace",
            trace_file=[
                _cache(tmp_path / "a.json"),
                _cache(tmp_path / "b.json", device="NVIDIA RTX A4000"),
            ],
        )


def test_a_folder_reads_its_caches_and_says_why_it_skipped_the_rest(tmp_path: Path) -> None:
    from kernelstream.kernels.backends.trace import load_caches_in

    _cache(tmp_path / "A100.json.gz", gz=True)
    # What the autotuning benchmark hub ships beside each cache: T4 results and metadata.
    t4 = {"schema_version": "1.0.0", "results": [{"configuration": {"block_size_x": 16}}]}
    with gzip.open(tmp_path / "A100_T4.json.gz", "wt") as fh:
        json.dump(t4, fh)
    meta = {"schema_version": "1.0.0", "environment": {"device_name": "A100"}}
    (tmp_path / "A100-metadata.json").write_text(json.dumps(meta))
    (tmp_path / "broken.json").write_text('{"kernel_name": "k", "cache": {')
    (tmp_path / "space.T1.json").write_text("{}")  # a space description, not listed at all
    spaces, skipped = load_caches_in(tmp_path)
    assert [s.path.name for s in spaces] == ["A100.json.gz"]
    assert {p.name for p in skipped} == {"A100_T4.json.gz", "A100-metadata.json", "broken.json"}
    assert "T4 results file" in skipped[tmp_path / "A100_T4.json.gz"]
    assert "T4 metadata file" in skipped[tmp_path / "A100-metadata.json"]
    assert "missing or malformed KeyError('device_name')" in skipped[tmp_path / "broken.json"]
    with pytest.raises(TraceFileError, match="T4 results file"):
        load_cache(tmp_path / "A100_T4.json.gz")
    assert load_caches_in(tmp_path / "absent") == ([], {})


def test_a_gpu_missing_from_the_device_table_replays_with_peaks_of_zero(tmp_path: Path) -> None:
    from kernelstream.kernels.runner import LaunchBatcher, WorkloadRunner
    from kernelstream.schemas import LaunchBatch
    from kernelstream.schemas.codec import decode

    dev = open_device(
        "trace", trace_file=_cache(tmp_path / "mi.json", device="AMD Instinct MI250X")
    )
    assert dev.spec.name == "AMD Instinct MI250X" and not dev.spec.peaks_known
    runner = WorkloadRunner(dev, dev.workloads())
    batcher = LaunchBatcher(dev, "node-1")
    for chunk in runner.tick(0.0) + runner.tick(0.05):
        batcher.add(chunk, 0.05)
    (batch,) = batcher.flush()
    # On the wire as any other node's telemetry: durations measured, roofline unknown.
    back = decode(batch.wire(binary=False), LaunchBatch)
    assert back.device_model == "AMD Instinct MI250X"
    assert (back.peak_gbs, back.peak_gflops, back.occupancy, back.waves) == (0.0, 0.0, 0.0, 0.0)
    assert back.duration_us and all(d > 0 for d in back.duration_us)


def _as_kernel_tuner_writes_it(closed: Path, out: Path, *, close: bool = False) -> Path:
    """``closed``'s document written the way Kernel Tuner writes a cache while it tunes.

    The header (``json.dumps(..., indent="")`` without its last three characters, so it
    ends with ``"cache": {``), then one line per measured configuration ending with a
    comma; ``close`` ends it the way Kernel Tuner closes it when the session ends.
    """
    doc = json.loads(closed.read_text())
    cache = doc.pop("cache")
    text = json.dumps({**doc, "cache": {}}, indent="")[:-3]
    for key, rec in cache.items():
        text += "\n" + json.dumps({key: rec})[1:-1] + ","
    if close:
        text = text[:-1] + "}\n}"
    out.write_text(text)
    return out


def test_open_cache_reads_like_the_closed_one(tmp_path: Path) -> None:
    closed = load_cache(_cache(tmp_path / "closed.json"))
    for close in (False, True):
        out = tmp_path / f"kt{close}.json"
        f = _as_kernel_tuner_writes_it(tmp_path / "closed.json", out, close=close)
        w = load_cache(f)
        assert w.space.size() == closed.space.size() == 5
        assert w.failed == closed.failed
        assert w.times_us.keys() == closed.times_us.keys()
        for cid, t in closed.times_us.items():
            np.testing.assert_array_equal(w.times_us[cid], t)
    # Gzipped, as a user keeps a copy of a running session's file.
    text = (tmp_path / "ktFalse.json").read_text()
    with gzip.open(tmp_path / "open.json.gz", "wt") as fh:
        fh.write(text)
    assert load_cache(tmp_path / "open.json.gz").failed == closed.failed


def test_open_cache_with_a_cut_off_last_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = _as_kernel_tuner_writes_it(_cache(tmp_path / "c.json"), tmp_path / "kt.json")
    text = f.read_text()
    f.write_text(text[: text.rindex('"time"') + 4])  # killed while writing the last entry
    with caplog.at_level("WARNING", logger="kernelstream.trace"):
        w = load_cache(f)
    assert w.space.size() == 4  # the last of the five entries is left out, with a warning
    assert "cut off mid-write" in caplog.text
    # A session stopped before its first measurement: a header and nothing else.
    header = text[: text.index('"cache": {') + len('"cache": {')]
    (tmp_path / "empty.json").write_text(header + "\n")
    with pytest.raises(TraceFileError, match="no configuration has a measured time"):
        load_cache(tmp_path / "empty.json")
    # Not Kernel Tuner's open form: the header itself is broken.
    (tmp_path / "bad.json").write_text('{"device_name": "A100",, "cache": {\n"1": {},')
    with pytest.raises(TraceFileError, match="cannot read Kernel Tuner cache"):
        load_cache(tmp_path / "bad.json")


def test_kernel_tuner_reads_the_same_open_cache(tmp_path: Path) -> None:
    """Cross-check with the peer tool itself (``pip install -e '.[bench]'``)."""
    kt_util = pytest.importorskip("kernel_tuner.util", reason="kernel_tuner is a bench extra")
    f = _as_kernel_tuner_writes_it(_cache(tmp_path / "c.json"), tmp_path / "kt.json")
    theirs = kt_util.read_cache(str(f), open_cache=False)["cache"]
    ours = load_cache(f)
    measured = {k for k, r in theirs.items() if not isinstance(r["time"], str)}
    assert len(measured) == len(ours.times_us) == 4
    assert len(theirs) == ours.space.size()


def test_problem_size_as_kernel_tuner_stores_it(tmp_path: Path) -> None:
    doc = json.loads(_cache(tmp_path / "c.json").read_text())
    doc["kernel_name"] = "vector_add"
    raw: Any
    for raw, size in ((1000, (1000,)), ([1000], (1000,)), (["256", 128], (256, 128))):
        (tmp_path / "v.json").write_text(json.dumps({**doc, "problem_size": raw}))
        w = load_cache(tmp_path / "v.json")
        assert w.problem_size == size
        assert w.geometry(w.default).grid[0] == -(-size[0] // int(w.default["block_size_x"]))
    # A 1-D size for a kernel named like the modelled ones: no bytes or FLOPs, no crash.
    (tmp_path / "c1.json").write_text(
        json.dumps({**doc, "kernel_name": "convolution_1d", "problem_size": 4096})
    )
    w = load_cache(tmp_path / "c1.json")
    assert w.flops(w.default) == 0.0 and w.bytes_moved(w.default) == 0.0
    # Sizes that depend on the configuration cannot be grouped by: a clear error.
    for raw in ("callable", ["block_size_x*4", 1], [], [0], [1, 2, 3, 4], True):
        (tmp_path / "v.json").write_text(json.dumps({**doc, "problem_size": raw}))
        with pytest.raises(TraceFileError, match="problem_size"):
            load_cache(tmp_path / "v.json")


@pytest.mark.realdata
def test_real_tuning_spaces(real_spaces: Path) -> None:
    files = sorted(real_spaces.glob("*.json.gz"))
    assert len(files) >= 4
    for f in files:
        w = load_cache(f)
        dev = open_device("trace", trace_file=f)
        assert dev.spec.name in {"A100-PCIE-40GB", "RTX-A4000", "RTX-3090"}
        assert w.space.is_valid(w.default)
        r = dev.launch(w, w.default, 10)
        assert r.ok.all()
        t = r.duration_us.min() * 1e-6
        plan = dev.plan(w, w.default)
        assert plan.bytes_moved / t <= dev.spec.peak_gbs * 1e9
        assert plan.flops / t <= dev.spec.peak_gflops_fp32 * 1e9
        if w.name.startswith("dedispersion"):
            assert "not valid" in w.start_note  # the T1 default breaks its own conditions
            assert w.default["tile_stride_x"] == 0
        elif w.name.startswith("convolution") and "milo" in f.name:
            assert w.space.size() == 4362  # 4201 measured + 161 that failed


def _conv_config(bx: int) -> dict[str, int]:
    return {"block_size_x": bx, "block_size_y": 1, "filter_width": 15, "filter_height": 15}


def test_a_configs_launches_are_one_stream_however_split_and_shared(tmp_path: Path) -> None:
    from kernelstream.kernels.backends.trace import LaunchNoise, TraceDevice

    # Common random numbers: the k-th launch of a config draws the same duration whether
    # one node launches it in one call or the nodes of a fleet (one noise source) launch
    # it in pieces between other configs, so runs of one seed differ only by the tuner.
    f = _cache(tmp_path / "conv.json")
    alone = TraceDevice(f, seed=7)
    (w,) = alone.workloads()
    whole = alone.launch(w, _conv_config(32), 200).duration_us
    noise = LaunchNoise(7)
    a, b = TraceDevice(f, noise=noise), TraceDevice(f, noise=noise)
    pieces = [a.launch(w, _conv_config(32), 50).duration_us]
    b.launch(w, _conv_config(16), 33)  # another config's launches draw from their own stream
    pieces.append(b.launch(w, _conv_config(32), 70).duration_us)
    a.launch(w, _conv_config(64), 9)
    pieces.append(a.launch(w, _conv_config(32), 80).duration_us)
    np.testing.assert_array_equal(np.concatenate(pieces), whole)
    b.close()  # a node closing does not reset the fleet's streams
    assert not np.array_equal(a.launch(w, _conv_config(32), 50).duration_us, whole[:50])


def test_launch_noise_stays_independent_uniform_draws_of_the_measured_times() -> None:
    from kernelstream.kernels.backends.trace import LaunchNoise

    times = np.array([2.9, 3.0, 3.1])
    noise = LaunchNoise(11)
    draws = np.concatenate([noise.draw("k", "c", times, n) for n in (1, 999, 29_000, 30_000)])
    assert len(draws) == 60_000
    # Each measured time a third of the draws (binomial sd 0.0019), consecutive draws
    # equal a third of the time (no serial dependence across calls), and another
    # config's stream is not this one.
    share = np.array([np.mean(draws == t) for t in times])
    assert np.all(np.abs(share - 1 / 3) < 0.01), share
    assert abs(np.mean(draws[1:] == draws[:-1]) - 1 / 3) < 0.01
    other = noise.draw("k", "other", times, 60_000)
    assert abs(np.mean(other == draws) - 1 / 3) < 0.01


def test_what_json_reads_beyond_orjson_still_loads(tmp_path: Path) -> None:
    # orjson parses the measured spaces; json takes what it refuses: NaN and Infinity
    # (Kernel Tuner's json.dumps writes them) and integers past 64 bits.
    f = _cache(tmp_path / "odd.json")
    doc = json.loads(f.read_text())
    doc["cache"]["16,1,15,15"]["times"] = [1.0, float("inf"), float("nan")]
    doc["cache"]["16,1,15,15"]["compile_time"] = 2**70
    f.write_text(json.dumps(doc))
    from kernelstream.kernels.backends.trace import read_cache_document

    assert read_cache_document(f)["cache"]["16,1,15,15"]["compile_time"] == 2**70
    assert load_cache(f).kernel_name == "convolution_kernel"


def test_a_caches_kernel_name_is_read_from_its_header(tmp_path: Path) -> None:
    from kernelstream.kernels.backends.trace import cache_kernel_name

    assert cache_kernel_name(_cache(tmp_path / "c.json")) == "convolution_kernel"
    assert cache_kernel_name(_cache(tmp_path / "c.json.gz", gz=True)) == "convolution_kernel"
    doc = json.loads((tmp_path / "c.json").read_text())
    # entries before the name, a name with an escape, no name, not JSON: left to the full read
    late = tmp_path / "late.json"
    late.write_text(json.dumps({"cache": doc["cache"], "kernel_name": "convolution_kernel"}))
    escaped = tmp_path / "escaped.json"
    escaped.write_text(json.dumps({**doc, "kernel_name": 'a"b'}))
    nameless = tmp_path / "nameless.json"
    nameless.write_text(json.dumps({k: v for k, v in doc.items() if k != "kernel_name"}))
    junk = tmp_path / "junk.json.gz"
    junk.write_bytes(b"not gzip")
    for path in (late, escaped, nameless, junk, tmp_path / "missing.json"):
        assert cache_kernel_name(path) is None, path


def test_the_what_if_loads_only_the_caches_of_kernels_the_range_ran(
    tmp_path: Path, cache_reads: list[str]
) -> None:
    from kernelstream.agents.logic.windowing import Windower, make_example_batch
    from kernelstream.app.replay.whatif import trace_what_if

    conv = _cache(tmp_path / "conv.json")
    other = tmp_path / "other.json.gz"
    with gzip.open(other, "wt") as fh:
        json.dump({**json.loads(conv.read_text()), "kernel_name": "gemm"}, fh)
    w = Windower()
    config = {"block_size_x": 16, "block_size_y": 1, "filter_width": 15, "filter_height": 15}
    w.add(
        make_example_batch(
            [0.1, 0.2],
            kernel="convolution_kernel",
            problem_size=[256, 128],
            config=config,
            device_model="A100-PCIE-40GB",
        ),
        now=0.0,
    )
    entries = trace_what_if(w.flush_all(), [conv, other])
    assert cache_reads == ["conv.json"] and len(entries) == 1
