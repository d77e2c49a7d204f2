"""The replay report: a JSON summary, JSON lines of every result, PNG plots, one HTML page.

Layout of a report directory::

    index.html            self-contained page (plots embedded as data URIs): open offline
    summary.json          GPU time shares, roofline points, findings and recommendations
                          with evidence and gains, what-if; sorted keys, no wall-clock time
    windows.jsonl         every window aggregate, in (stream key, window start, config) order
    findings.jsonl        every finding, in (window end, id) order
    recommendations.jsonl the offline tuner's recommendations
    alerts.jsonl          the predictive alerts, in the order the forecaster issued them
    plots/*.png           gpu_share, roofline_<model>, timeline_<kernel>
    run.json              when and how long the replay ran (the only non-deterministic file)

Everything but ``run.json`` is a function of the replayed records and the options:
the same range gives byte-identical files.
"""

from __future__ import annotations

import base64
import html
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from kernelstream.app.replay.alerts_report import alerts_section, alerts_summary
from kernelstream.app.replay.analysis import AnalysisResult
from kernelstream.app.replay.host_timeline import host_section, host_timeline, render_host_plots
from kernelstream.app.replay.series import series_summary
from kernelstream.app.replay.whatif import fleet_sweep, trace_what_if
from kernelstream.schemas import Finding, Recommendation, ReconfigOutcome, WindowAggregate

__all__ = ["build_summary", "dumps", "write_report"]

_JSON_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY


def dumps(obj: Any) -> bytes:
    """Deterministic JSON: sorted keys, orjson's shortest round-trip floats, NaN as null."""
    return orjson.dumps(obj, option=_JSON_OPTS)


def _series_key(r: Any) -> str:
    return f"{r.node}:{r.device_index}/{r.kernel}"


def _gpu_time(windows: Sequence[WindowAggregate]) -> dict[str, Any]:
    per: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for w in windows:
        a = per[(w.kernel, w.device_model, f"{w.node}:{w.device_index}")]
        a[0] += w.duration_mean_us * w.count * 1e-6
        a[1] += w.count
    total = sum(a[0] for a in per.values()) or 1.0
    rows: list[dict[str, Any]] = [
        {
            "kernel": k,
            "device_model": m,
            "device": d,
            "gpu_time_s": t,
            "launches": n,
            "share": t / total,
        }
        for (k, m, d), (t, n) in per.items()
    ]
    rows.sort(key=lambda r: (-r["gpu_time_s"], r["kernel"], r["device"]))

    def totals(field: str) -> list[dict[str, Any]]:
        acc: dict[str, float] = defaultdict(float)
        for r in rows:
            acc[r[field]] += r["gpu_time_s"]
        return [
            {field: k, "gpu_time_s": v, "share": v / total}
            for k, v in sorted(acc.items(), key=lambda kv: (-kv[1], kv[0]))
        ]

    return {
        "total_s": sum(r["gpu_time_s"] for r in rows),
        "by_series": rows,
        "by_kernel": totals("kernel"),
        "by_device_model": totals("device_model"),
    }


def _roofline(windows: Sequence[WindowAggregate]) -> list[dict[str, Any]]:
    """Per device model: its roofs and one point per (kernel, problem size, config)."""
    models: dict[str, dict[str, Any]] = {}
    acc: dict[tuple[str, str, tuple[int, ...], str], list[Any]] = {}
    for w in windows:
        if w.count == 0 or not w.roofline_known:
            continue  # nothing launched, or a GPU model without known peaks: no roofs
        models.setdefault(w.device_model, {"peak_gbs": w.peak_gbs, "peak_gflops": w.peak_gflops})
        key = (w.device_model, w.kernel, tuple(w.problem_size), w.config_id)
        a = acc.setdefault(key, [0.0, 0.0, 0, w.arithmetic_intensity, set()])
        busy = w.duration_mean_us * w.count
        a[0] += w.achieved_gflops * busy  # time-weighted: total FLOP over total time
        a[1] += busy
        a[2] += w.count
        a[4].add(f"{w.node}:{w.device_index}")
    out = []
    for model, peaks in sorted(models.items()):
        points = [
            {
                "kernel": k,
                "problem_size": list(size),
                "config_id": cid,
                "arithmetic_intensity": ai,
                "achieved_gflops": fl / busy if busy else 0.0,
                "launches": n,
                "devices": sorted(devs),
            }
            for (m, k, size, cid), (fl, busy, n, ai, devs) in sorted(acc.items())
            if m == model
        ]
        out.append(
            {
                "device_model": model,
                **peaks,
                "points": points,
                "off_roofline": _off_roofline(windows, model),
            }
        )
    return out


def _off_roofline(windows: Sequence[WindowAggregate], model: str) -> list[dict[str, Any]]:
    """Kernels of a model with no FLOP (a copy or transpose): a FLOP roofline has no place
    for them (intensity 0 on a log axis), so the report names them with their best
    achieved bandwidth instead of leaving them out silently."""
    best: dict[str, WindowAggregate] = {}
    for w in windows:
        if w.device_model != model or w.count == 0 or w.arithmetic_intensity > 0:
            continue
        if w.kernel not in best or w.achieved_gbs > best[w.kernel].achieved_gbs:
            best[w.kernel] = w
    return [
        {
            "kernel": k,
            "reason": "0 FLOP, moves data only",
            "best_achieved_gbs": w.achieved_gbs,
            "best_bw_fraction": w.bw_fraction,
            "best_config_id": w.config_id,
        }
        for k, w in sorted(best.items())
    ]


def _timeline(
    windows: Sequence[WindowAggregate],
    outcomes: Sequence[ReconfigOutcome],
    recs: Sequence[Recommendation],
) -> list[dict[str, Any]]:
    """Per series: its windows' durations over time, with recommendations and outcomes."""
    series: dict[str, dict[str, Any]] = {}
    for w in windows:
        s = series.setdefault(
            w.stream_key,
            {
                "series": w.stream_key,
                "node": w.node,
                "device_model": w.device_model,
                "kernel": w.kernel,
                "windows": [],
                "recommendations": [],
                "outcomes": [],
            },
        )
        s["windows"].append(
            {
                "t": w.window_start,
                "mean_us": w.duration_mean_us,
                "p95_us": w.duration_p95_us,
                "count": w.count,
                "config_id": w.config_id,
            }
        )
    for r in recs:
        if _series_key(r) in series:
            series[_series_key(r)]["recommendations"].append(
                {"t": r.issued_at, "id": r.id, "config_id": r.config_id}
            )
    for o in outcomes:
        if _series_key(o) in series:
            series[_series_key(o)]["outcomes"].append(
                {"t": o.at, "status": o.status, "recommendation_id": o.recommendation_id}
            )
    for s in series.values():
        s["windows"].sort(key=lambda x: (x["t"], x["config_id"]))
    return [series[k] for k in sorted(series)]


def _findings(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    """Findings condensed per (series, config, classification), latest evidence kept."""
    groups: dict[tuple[str, str, str], list[Finding]] = defaultdict(list)
    for f in findings:
        groups[(_series_key(f), f.config_id, f.classification)].append(f)
    rows = []
    for (series, cid, cls), fs in sorted(groups.items()):
        last = max(fs, key=lambda f: (f.window_end, f.id))
        rows.append(
            {
                "series": series,
                "device_model": last.device_model,
                "config_id": cid,
                "classification": cls,
                "windows": len(fs),
                "first_window": min(f.window_start for f in fs),
                "last_window": last.window_start,
                "summary": last.summary,
                "evidence": last.evidence,
            }
        )
    return rows


def _window_mean(
    windows: Iterable[WindowAggregate], series: str, config_id: str
) -> tuple[float | None, int]:
    s = n = 0.0
    for w in windows:
        if w.stream_key == series and w.config_id == config_id and w.count:
            s += w.duration_mean_us * w.count
            n += w.count
    return (s / n if n else None), int(n)


def _recommendations(
    recs: Sequence[Recommendation],
    outcomes: Sequence[ReconfigOutcome],
    windows: Sequence[WindowAggregate],
) -> list[dict[str, Any]]:
    """Recorded recommendations with their outcomes and the gain windows measured."""
    by_rec: dict[str, list[ReconfigOutcome]] = defaultdict(list)
    for o in outcomes:
        by_rec[o.recommendation_id].append(o)
    rows = []
    for r in recs:
        outs = sorted(by_rec.get(r.id, []), key=lambda o: (o.at, o.id))
        final = outs[-1] if outs else None
        before, n_before = _window_mean(windows, _series_key(r), r.from_config_id)
        after, n_after = _window_mean(windows, _series_key(r), r.config_id)
        rows.append(
            {
                "id": r.id,
                "series": _series_key(r),
                "device_model": r.device_model,
                "issued_at": r.issued_at,
                "from_config_id": r.from_config_id,
                "config_id": r.config_id,
                "reason": r.reason,
                "classification": r.evidence.get("classification"),
                "evidence": r.evidence,
                "expected_gain": r.expected_gain,
                "status": final.status if final else "no outcome",
                "statuses": [o.status for o in outs],
                "node_measured_speedup": next(
                    (o.speedup for o in reversed(outs) if o.speedup is not None), None
                ),
                "node_before_mean_us": final.before_mean_us if final else None,
                "node_after_mean_us": final.after_mean_us if final else None,
                "window_before_mean_us": before,
                "window_after_mean_us": after,
                "window_gain": (before / after - 1.0) if before and after else None,
                "window_launches": [n_before, n_after],
            }
        )
    return rows


def build_summary(
    res: AnalysisResult,
    *,
    input_info: dict[str, Any],
    options: dict[str, Any],
    trace_paths: Sequence[Path] = (),
) -> dict[str, Any]:
    """The report's content as JSON-able data (deterministic in its input)."""
    classes: dict[str, int] = defaultdict(int)
    for f in res.findings:
        classes[f.classification] += 1
    return {
        "schema": "ks.replay_report/1",
        "input": input_info,
        "options": options,
        "totals": {
            "launch_messages": res.launch_messages,
            "launches": res.launches,
            "launches_too_late": res.late_launches,
            "launches_duplicate": res.duplicate_launches,
            "messages_filtered_out": res.skipped_messages,
            "rejected": dict(sorted(res.rejected.items())),
            "windows": len(res.windows),
            "findings": len(res.findings),
            "findings_by_classification": dict(sorted(classes.items())),
            "recorded_recommendations": len(res.recorded_recommendations),
            "recorded_outcomes": len(res.recorded_outcomes),
            "offline_recommendations": len(res.recommendations),
        },
        "series": series_summary(res.windows, res.recorded_outcomes),
        "gpu_time": _gpu_time(res.windows),
        "roofline": _roofline(res.windows),
        "timeline": _timeline(res.windows, res.recorded_outcomes, res.recorded_recommendations),
        "host_timeline": host_timeline(res.host_windows),
        "findings": _findings(res.findings),
        "recommendations": _recommendations(
            res.recorded_recommendations, res.recorded_outcomes, res.windows
        ),
        "offline_recommendations": [
            {
                "id": r.id,
                "series": _series_key(r),
                "issued_at": r.issued_at,
                "from_config_id": r.from_config_id,
                "config_id": r.config_id,
                "reason": r.reason,
                "expected_gain": r.expected_gain,
            }
            for r in res.recommendations
        ],
        "alerts": alerts_summary(res.alerts, res.alert_refusals),
        "what_if": {
            "trace": trace_what_if(res.windows, list(trace_paths)),
            "fleet_sweep": fleet_sweep(res.windows),
        },
    }


def _jsonl(records: Iterable[Any]) -> bytes:
    return b"".join(orjson.dumps(r.to_wire(), option=orjson.OPT_SORT_KEYS) + b"\n" for r in records)


def write_report(
    out_dir: Path, res: AnalysisResult, summary: dict[str, Any], run_info: dict[str, Any]
) -> Path:
    """Write the report directory; return the path of its ``index.html``."""
    from kernelstream.app.replay.plots import render_plots

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_bytes(dumps(summary))
    (out_dir / "windows.jsonl").write_bytes(_jsonl(res.windows))
    (out_dir / "findings.jsonl").write_bytes(_jsonl(res.findings))
    (out_dir / "recommendations.jsonl").write_bytes(_jsonl(res.recommendations))
    (out_dir / "alerts.jsonl").write_bytes(_jsonl(res.alerts))
    plots = render_plots(summary, out_dir / "plots")
    plots["host"] = render_host_plots(summary, out_dir / "plots")
    page = out_dir / "index.html"
    page.write_text(render_html(summary, plots), encoding="utf-8")
    (out_dir / "run.json").write_bytes(dumps(run_info))
    return page


# -- HTML ------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1200px;color:#222;padding:0 1em;line-height:1.4}
h1{font-size:1.6em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:.85em;width:100%}
th,td{border:1px solid #ddd;padding:.3em .5em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr:nth-child(even) td{background:#fafafa}img{max-width:100%;border:1px solid #eee;margin:.5em 0}
.muted{color:#777;font-size:.85em}.ok{color:#1a7f37}.bad{color:#b42318}
details{margin:.2em 0}code{font-size:.9em;background:#f3f3f3;padding:0 .2em}
.kpi{display:inline-block;margin:0 1.5em .5em 0}.kpi b{font-size:1.4em;display:block}
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _brk(x: Any) -> str:
    """Escaped text that may wrap after commas (config ids are long and unspaced)."""
    return _e(x).replace(",", ",<wbr>")


def _num(x: Any, fmt: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, fmt) if isinstance(x, (int, float)) else _e(x)


def _times(x: Any) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _pct(x: Any) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: set[int]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r)
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _evidence(ev: dict[str, Any]) -> str:
    items = ", ".join(
        f"{_e(k)}={_num(v) if isinstance(v, float) else _e(v)}" for k, v in sorted(ev.items())
    )
    return f"<details><summary>evidence</summary><span class='muted'>{items}</span></details>"


def render_html(summary: dict[str, Any], plots: dict[str, list[tuple[str, Path]]]) -> str:
    """The self-contained report page."""
    t = summary["totals"]
    inp = summary["input"]
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<title>kernelstream replay report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>kernelstream replay report</h1>",
        f"<p class='muted'>Range: {_e(inp.get('description', ''))}. Filters: "
        f"{_e(_filters(summary['options'].get('filters') or {}))}. Windows, findings and the "
        "offline tuner "
        "ran the workers' own code over the recorded launches.</p>",
        "<div>",
        *(
            f"<span class='kpi'><b>{_e(v)}</b>{_e(k)}</span>"
            for k, v in (
                ("launches", f"{t['launches']:,}"),
                ("GPU time", f"{summary['gpu_time']['total_s']:.3g} s"),
                ("windows", t["windows"]),
                ("findings", t["findings"]),
                ("recommendations (recorded)", t["recorded_recommendations"]),
                ("outcomes (recorded)", t["recorded_outcomes"]),
            )
        ),
        "</div>",
    ]
    if t["rejected"] or t["launches_too_late"]:
        parts.append(
            f"<p class='bad'>Refused at the edge: {_e(t['rejected'])}; launches too late for "
            f"their window: {t['launches_too_late']}.</p>"
        )
    parts += _series_section(summary)
    parts += _gpu_section(summary, plots)
    parts += _roofline_section(summary, plots)
    parts += _timeline_section(plots)
    parts += alerts_section(summary)
    parts += host_section(summary, plots)
    parts += _findings_section(summary)
    parts += _recommendation_section(summary)
    parts += _what_if_section(summary)
    parts.append(
        "<p class='muted'>Machine-readable: summary.json, windows.jsonl, findings.jsonl, "
        "recommendations.jsonl, alerts.jsonl in this directory.</p></body></html>"
    )
    return "\n".join(parts)


def _filters(flt: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {v}" for k, v in sorted(flt.items()) if v is not None) or "none"


def _series_section(summary: dict[str, Any]) -> list[str]:
    rows = summary["series"]
    return [
        "<h2>What tuning kept</h2>",
        "<p class='muted'>Per series: its default configuration (first window), the fastest "
        "configuration the node kept (the default or one a <i>kept</i> outcome left in "
        "place) and the one running when the range ended (<i>trial</i>: not judged yet). "
        "Each mean is over all windows of that configuration; speedup is default over best "
        "kept. <code>kernelstream demo</code> prints the same table.</p>",
        _table(
            [
                "series",
                "device model",
                "default (us)",
                "best kept (us)",
                "speedup",
                "current (us)",
                "best kept config",
                "current config",
                "kept / rolled back",
            ],
            (
                [
                    _e(f"{r['node']}:{r['device_index']}/{r['kernel']}"),
                    _e(r["device_model"]),
                    _num(r["default_mean_us"], ".1f"),
                    _num(r["best_kept_mean_us"], ".1f"),
                    _times(r["speedup"]),
                    _num(r["current_mean_us"], ".1f"),
                    f"<code>{_brk(r['best_kept_config_id'])}</code>",
                    f"<code>{_brk(r['current_config_id'])}</code>"
                    + ("" if r["current_is_kept"] else " (trial)"),
                    f"{r['kept']} / {r['rolled_back']}",
                ]
                for r in rows
            ),
            {2, 3, 4, 5, 8},
        ),
    ]


def _gpu_section(summary: dict[str, Any], plots: dict[str, list[tuple[str, Path]]]) -> list[str]:
    g = summary["gpu_time"]
    out = ["<h2>Where the GPU time goes</h2>"]
    out += [_img(p, title) for title, p in plots.get("gpu_share", [])]
    out.append(
        _table(
            ["kernel", "device model", "device", "GPU time (s)", "share", "launches"],
            (
                [
                    _e(r["kernel"]),
                    _e(r["device_model"]),
                    _e(r["device"]),
                    _num(r["gpu_time_s"], ".2f"),
                    _pct(r["share"]),
                    f"{r['launches']:,}",
                ]
                for r in g["by_series"]
            ),
            {3, 4, 5},
        )
    )
    return out


def _roofline_section(
    summary: dict[str, Any], plots: dict[str, list[tuple[str, Path]]]
) -> list[str]:
    out = [
        "<h2>Roofline per device model</h2>",
        "<p class='muted'>Each point is one kernel configuration: arithmetic intensity "
        "(FLOP per byte moved) against achieved GFLOP/s, time-weighted over its windows; "
        "a star marks each kernel's best. Lines are the device's bandwidth and compute "
        "roofs.</p>",
    ]
    out += [_img(p, title) for title, p in plots.get("roofline", [])]
    off = [(m["device_model"], o) for m in summary["roofline"] for o in m["off_roofline"]]
    if off:
        out.append(
            "<p class='muted'>Not on a roofline (no FLOP to place them by): "
            + "; ".join(
                f"{_e(o['kernel'])} on {_e(model)}, best {_num(o['best_achieved_gbs'], '.0f')} "
                f"GB/s ({_pct(o['best_bw_fraction'])} of peak bandwidth)"
                for model, o in off
            )
            + ".</p>"
        )
    return out


def _timeline_section(plots: dict[str, list[tuple[str, Path]]]) -> list[str]:
    out = [
        "<h2>Timelines</h2>",
        "<p class='muted'>Mean kernel duration per window (shaded: up to p95), one line per "
        "device; markers: recommendation issued (grey triangle), applied (blue), kept "
        "(green), rolled back (red cross).</p>",
    ]
    out += [_img(p, title) for title, p in plots.get("timeline", [])]
    return out


def _findings_section(summary: dict[str, Any]) -> list[str]:
    rows = summary["findings"]
    per: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    latest: dict[str, dict[str, Any]] = {}
    for r in rows:
        per[r["series"]][r["classification"]] += r["windows"]
        if r["series"] not in latest or r["last_window"] > latest[r["series"]]["last_window"]:
            latest[r["series"]] = r
    overview = _table(
        ["series", "windows by classification", "latest finding"],
        (
            [
                _e(series),
                "<br>".join(
                    f"{_e(c)}: {n}"
                    for c, n in sorted(per[series].items(), key=lambda kv: (-kv[1], kv[0]))
                ),
                _brk(latest[series]["summary"]),
            ]
            for series in sorted(per)
        ),
        set(),
    )
    detail = _table(
        ["series", "config", "classification", "windows", "summary", "evidence"],
        (
            [
                _e(r["series"]),
                f"<code>{_brk(r['config_id'])}</code>",
                _e(r["classification"]),
                str(r["windows"]),
                _brk(r["summary"]),
                _evidence(r["evidence"]),
            ]
            for r in rows
        ),
        {3},
    )
    return [
        "<h2>Findings</h2>",
        f"<p class='muted'>{summary['totals']['findings']} findings (one per window). Per "
        "series: how its windows were classified, and what the latest one said.</p>",
        overview,
        f"<details><summary>Per configuration and classification ({len(rows)} rows, with "
        "the latest window's evidence)</summary>" + detail + "</details>",
    ]


def _status(s: str) -> str:
    cls = "ok" if s == "kept" else "bad" if s in ("rolled_back", "rejected") else ""
    return f"<span class='{cls}'>{_e(s)}</span>"


def _recommendation_overview(rows: Sequence[dict[str, Any]]) -> str:
    """One row per series: how many recommendations, how each ended, the best kept."""
    per: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        per[r["series"]].append(r)

    def best_kept(rs: list[dict[str, Any]]) -> float | None:
        kept = [r["node_measured_speedup"] for r in rs if r["status"] == "kept"]
        return max((k for k in kept if k is not None), default=None)

    return _table(
        [
            "series",
            "recommended",
            "kept",
            "rolled back",
            "rejected",
            "no outcome",
            "best kept step (node speedup)",
        ],
        (
            [
                _e(series),
                str(len(rs)),
                *(
                    str(sum(r["status"] == st for r in rs))
                    for st in ("kept", "rolled_back", "rejected", "no outcome")
                ),
                _times(best_kept(rs)),
            ]
            for series, rs in sorted(per.items())
        ),
        {1, 2, 3, 4, 5, 6},
    )


def _recommendation_section(summary: dict[str, Any]) -> list[str]:
    rows = summary["recommendations"]
    detail = _table(
        [
            "series",
            "from",
            "to",
            "reason",
            "expected gain",
            "outcome",
            "node speedup",
            "window speedup",
            "evidence",
        ],
        (
            [
                _e(r["series"]),
                f"<code>{_brk(r['from_config_id'])}</code>",
                f"<code>{_brk(r['config_id'])}</code>",
                _e(r["reason"]),
                _pct(r["expected_gain"]),
                _status(r["status"]),
                _times(r["node_measured_speedup"]),
                _times(None if r["window_gain"] is None else 1.0 + r["window_gain"]),
                _evidence(r["evidence"]),
            ]
            for r in rows
        ),
        {4, 6, 7},
    )
    out = [
        "<h2>Recommendations and what they gained</h2>",
        "<p class='muted'>Recorded recommendations (ks.recommendations) joined with the nodes' "
        "outcomes (ks.reconfig), per series. <i>node speedup</i>: the node's own before/after "
        "measurement of a step it kept.</p>",
        _recommendation_overview(rows),
        f"<details><summary>Every recommendation ({len(rows)}, with its reason, evidence "
        "and the window speedup: the mean duration of the series' windows with the old "
        "configuration over that with the new one, across the whole range)</summary>"
        + detail
        + "</details>",
    ]
    off = summary["offline_recommendations"]
    out.append(
        f"<details><summary>The offline tuner's recommendations for this range ({len(off)})"
        "</summary>"
        + _table(
            ["series", "at", "from", "to", "reason", "expected gain"],
            (
                [
                    _e(r["series"]),
                    _num(r["issued_at"], ".3f"),
                    f"<code>{_brk(r['from_config_id'])}</code>",
                    f"<code>{_brk(r['config_id'])}</code>",
                    _e(r["reason"]),
                    _pct(r["expected_gain"]),
                ]
                for r in off
            ),
            {1, 5},
        )
        + "</details>"
    )
    return out


def _what_if_section(summary: dict[str, Any]) -> list[str]:
    wi = summary["what_if"]
    out = ["<h2>What if: other configurations</h2>"]
    if not wi["trace"]:
        out.append(
            "<p class='muted'>No Kernel Tuner cache file matches a replayed kernel and "
            "problem size (give one with --trace-file).</p>"
        )
    for g in wi["trace"]:
        note = "" if g["same_device_model"] else f" (measured on {g['trace_device_model']})"
        out.append(
            f"<h3>{_e(g['workload'])} {_e(g['problem_size'])} on {_e(g['device_model'])}: "
            f"trace {_e(g['trace_file'])}{_e(note)}</h3>"
            f"<p>The fleet ended on <code>{_brk(g['reference_config_id'])}</code> "
            f"({_num(g['reference_trace_mean_us'], '.1f')} us in the file). The file's best "
            f"of {g['configs_in_file']} configurations:</p>"
        )
        out.append(
            _table(
                ["config", "trace mean (us)", "gain over the fleet's final", "ran by the fleet"],
                (
                    [
                        f"<code>{_brk(b['config_id'])}</code>",
                        _num(b["trace_mean_us"], ".1f"),
                        _pct(b["expected_gain"]),
                        "yes" if b["ran_by_fleet"] else "no",
                    ]
                    for b in g["best_alternatives"]
                ),
                {1, 2},
            )
        )
        out.append(
            "<details><summary>Configurations the fleet ran, scored by the file</summary>"
            + _table(
                ["config", "launches", "measured mean (us)", "trace mean (us)"],
                (
                    [
                        f"<code>{_brk(r['config_id'])}</code>",
                        f"{r['launches']:,}",
                        _num(r["measured_mean_us"], ".1f"),
                        "failed" if r["trace_failed"] else _num(r["trace_mean_us"], ".1f"),
                    ]
                    for r in g["ran"]
                ),
                {1, 2, 3},
            )
            + "</details>"
        )
    out.append("<h3>The fleet's own sweep</h3>")
    out.append(
        "<p class='muted'>Every configuration any device of a model ran, scored by its "
        "measured mean: how much each device would gain by switching from its final "
        "configuration to the best one measured on its model.</p>"
    )
    out.append(
        _table(
            [
                "device model",
                "workload",
                "series",
                "final config",
                "final mean (us)",
                "best config",
                "best mean (us)",
                "gain if best",
            ],
            (
                [
                    _e(g["device_model"]),
                    _e(g["workload"]),
                    _e(s["series"]),
                    f"<code>{_brk(s['final_config_id'])}</code>",
                    _num(s["final_mean_us"], ".1f"),
                    f"<code>{_brk(g['best_config_id'])}</code>",
                    _num(g["best_mean_us"], ".1f"),
                    _pct(s["gain_if_best"]),
                ]
                for g in wi["fleet_sweep"]
                for s in g["series"]
            ),
            {4, 6, 7},
        )
    )
    return out
