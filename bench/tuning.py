"""``kernelstream bench tuning``: the tuner against offline autotuners on measured spaces.

For every Kernel Tuner cache file in ``--spaces`` (real brute-forced search spaces),
in one run and on the same spaces and budgets:

- **kernelstream**: the pipeline's own tuner, driven through
  :class:`agents.logic.closed_loop.ClosedLoop` (trace nodes launch the kernel, windows,
  detector, tuner, reconfiguration with rollback), from the space's default
  configuration. It sees the space only through measured (noisy) launches.
- **random**: uniform random search without replacement, from the same default.
- **Kernel Tuner** strategies in simulation mode (``tune_cache``), from their own
  (random) starting points, as Kernel Tuner runs them.

An *evaluation* is one unique configuration measured (a failed one counts). Scoring
uses the cache file's own mean times only: the best-so-far after each evaluation is the
true mean of the best configuration evaluated so far, the optimum is the file's fastest.

Reported per space and method: evaluations until the best-so-far is within 10% and 5%
of the optimum (median, 90th percentile, how many seeds got there within the budget),
the gap left after 50 and 100 evaluations, and the online cost (cumulative regret after
50, 100 and 200 windows, beside never tuning; :mod:`bench.tuning_score`). A last line
per space says whether kernelstream beats, ties or loses against the best peer; the
command exits 1 when a file was skipped or a run failed. Also the fleet effect (windows until
within 5% with 1 node vs 4 nodes sharing measurements) and a warm start (the same
kernel measured on another GPU model first) vs a cold one.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import gzip
import inspect
import json
import math
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import click
import numpy as np

from kernelstream.bench.results import dated_stem
from kernelstream.bench.tuning_score import (
    never_tune,
    paired_log_ratio,
    regret_summary,
    verdict,
)

__all__ = ["SIBLING_BUDGET", "command", "run_benchmark", "tuned_first"]

# Every Kernel Tuner 1.5.0 strategy that can run here was screened on the two convolution
# spaces (README, Tuning): nsga2 is its best on the A100 one and basinhopping on the
# A4000 one (by median), so both are peers. Not run: skopt (20 s for 30 evaluations),
# pyatf_strategies (fails with pyatf 0.0.13), minimize (stops after 10 evaluations),
# brute_force and random_sample (random search is run as its own peer).
KT_STRATEGIES = (
    "genetic_algorithm",
    "pso",
    "firefly_algorithm",
    "bayes_opt",
    "dual_annealing",
    "greedy_ils",
    "mls",
    "nsga2",
    "basinhopping",
)
THRESHOLDS = (1.10, 1.05)
GAP_AT = (50, 100)
FLEET_SIZES = (1, 4)

# Rough cost order of the runs (longest first); Kernel Tuner strategies and random
# search are short.
_COST_RANK = {"warm": 0, "fleet4": 1, "kernelstream": 2, "cold": 3, "kt:bayes_opt": 4}

# -- per-process state (worker processes load each space once) ----------------------
_SPACES: dict[str, Any] = {}


def _space(path: str) -> Any:
    if path not in _SPACES:
        from kernelstream.kernels.backends.trace import load_cache

        _SPACES[path] = load_cache(path)
    return _SPACES[path]


def _truth(ts: Any) -> dict[str, float]:
    return {cid: float(t.mean()) for cid, t in ts.times_us.items()}


def _window_s(ts: Any, truth: dict[str, float]) -> float:
    """Windows long enough for ~60 launches of the start config (at least 1 s)."""
    return max(1.0, math.ceil(60 * truth[ts.space.config_id(ts.default)] / 1e6))


def _loop(
    paths: Sequence[str],
    seed: int,
    nodes: int,
    budget: int,
    tuner: Any = None,
    windows: int | None = None,
    node_prefix: str = "node",
    settle: int = max(GAP_AT),
) -> Any:
    from kernelstream.agents.logic.closed_loop import ClosedLoop
    from kernelstream.agents.logic.reconfiguration import ReconfigPolicy
    from kernelstream.agents.logic.search import ModelGuidedSearch
    from kernelstream.agents.logic.tuning import Tuner
    from kernelstream.kernels.backends.trace import LaunchNoise, TraceDevice

    path = paths[0]
    ts = _space(path)
    truth = _truth(ts)
    opt = min(truth.values())
    if tuner is None:
        tuner = Tuner(strategy=ModelGuidedSearch(seed=seed))
    # One noise source for the whole fleet, seeded as node 0's own was: a one-node run
    # draws what it drew before, and a config's launches see the same durations whichever
    # node (of one or of four) makes them, so the fleet and warm comparisons are paired.
    noise = LaunchNoise(seed * 1000)
    devices = [TraceDevice(path, noise=noise) for _ in range(nodes)]
    loop = ClosedLoop(
        devices,
        ts.name,
        tuner,
        window_s=_window_s(ts, truth),
        truth=truth,
        policy=ReconfigPolicy(max_step=10**6, min_eval_s=0.0),
        node_prefix=node_prefix,
    )

    # With a ``budget`` of evaluations: stop at the budget; or once within 5% with the
    # curve long enough for every reported gap; or once the optimum itself is found
    # (nothing left to gain). With ``windows`` (the fleet comparison) the budget is
    # windows per node instead, the same for every fleet size: go on until within 5% or
    # that many windows. With both (the single-node run that also serves as the
    # fleet's one-node run), both. Once within 5%, a run with a budget goes on to
    # ``settle`` evaluations for the gaps (0: it stops there).
    def done(tr: Any) -> bool:
        n, best = len(tr.evaluated), tr.best_true[-1] if tr.best_true else math.inf
        reached = best <= opt * 1.05
        curve_done = not budget or n >= budget or best <= opt or (reached and n >= settle)
        return curve_done and (windows is None or reached or tr.rounds >= windows)

    loop.run(40 * budget + (windows or 0), stop=done)
    return loop


def _run_kernelstream(
    path: str,
    seed: int,
    budget: int,
    nodes: int = 1,
    windows: int | None = None,
    settle: int = max(GAP_AT),
) -> dict[str, Any]:
    """One tuner run for ``budget`` evaluations.

    With ``windows`` it goes on, if it has not got within 5% by then, until it does or
    has run that many windows: ``rounds_to_5`` is then also this seed's one-node fleet
    figure (the same run :func:`_run_fleet` would make for one node). With ``settle=0``
    it stops once within 5% (a cold run needed only for the fleet and warm figures).
    """
    loop = _loop([path], seed, nodes, budget, windows=windows, settle=settle)
    tr = loop.trace
    opt = min(loop.truth.values()) if loop.truth else math.inf
    rounds = tr.rounds_to(opt * 1.05)
    if windows is not None and rounds is not None and rounds > windows:
        rounds = None  # the evaluation budget ran past the window budget
    return {
        "curve": tr.best_true[:budget],
        "times": _times(loop.truth, [cid for cid, _ in tr.evaluated][:budget]),
        "rounds_to_5": rounds,
        "outcomes": tr.outcomes,
    }


def _times(truth: dict[str, float], ids: Sequence[str]) -> list[float]:
    """True mean time of each config evaluated, in order (inf for one that failed)."""
    return [truth.get(cid, math.inf) for cid in ids]


def _run_fleet(path: str, seed: int, nodes: int, windows: int) -> dict[str, Any]:
    """Windows (per node) until within 5%, with at most ``windows`` for any fleet size."""
    loop = _loop([path], seed, nodes, budget=0, windows=windows)
    opt = min(loop.truth.values()) if loop.truth else math.inf
    return {"rounds_to_5": loop.trace.rounds_to(opt * 1.05), "windows": windows}


def _run_warm(path: str, sibling: str, seed: int, budget: int) -> dict[str, Any]:
    """Tune ``sibling`` (another GPU, same kernel) first, then ``path`` with that knowledge.

    The warm start is an option of the search (``warm_start``, off by default since it
    measured worse than cold on the A100 convolution space); this turns it on.
    """
    from kernelstream.agents.logic.search import ModelGuidedSearch
    from kernelstream.agents.logic.tuning import Tuner

    tuner = Tuner(strategy=ModelGuidedSearch(seed=seed, warm_start=True))
    loop = _loop([path], seed, 1, budget, tuner=tuned_first(sibling, seed, tuner))
    ids = [cid for cid, _ in loop.trace.evaluated][:budget]
    return {"curve": loop.trace.best_true[:budget], "times": _times(loop.truth, ids)}


SIBLING_BUDGET = 100
"""Evaluations on the other GPU before a warm-started run."""


def tuned_first(sibling: str, seed: int, tuner: Any, budget: int = SIBLING_BUDGET) -> Any:
    """``tuner`` after tuning ``sibling`` (the same kernel on another GPU model) for
    ``budget`` evaluations on one node of that GPU.

    Another GPU model is another machine: its node gets a name of its own. The tuner keeps
    per-node state (what the node runs, what was rolled back on it, its latest window per
    config), and configuration ids are the same on both GPUs, so a node that kept its name
    would start the warm run barred from every config the other GPU rolled back and,
    with the clock starting again, with its first windows taken for redeliveries.
    """
    return _loop([sibling], seed, 1, budget=budget, tuner=tuner, node_prefix="sibling").tuner


def _run_random(path: str, seed: int, budget: int) -> dict[str, Any]:
    ts = _space(path)
    truth = _truth(ts)
    rng = np.random.default_rng(seed)
    ids = sorted(ts.times_us) + sorted(ts.failed)
    start = ts.space.config_id(ts.default)
    order = [start] + [ids[i] for i in rng.permutation(len(ids)) if ids[i] != start]
    times = _times(truth, order[:budget])
    return {"curve": [float(b) for b in np.minimum.accumulate(times)], "times": times}


def _run_kt(json_path: str, strategy: str, seed: int, budget: int) -> dict[str, Any]:
    import warnings

    from kernel_tuner.interface import tune_cache

    from kernelstream.kernels.backends.trace import is_measured_time

    random.seed(seed)
    np.random.seed(seed)  # Kernel Tuner's strategies draw from the global generators
    with warnings.catch_warnings(), _seeded_kt_samplers(seed):
        warnings.simplefilter("ignore")
        results, _ = tune_cache(
            json_path,
            strategy=strategy,
            strategy_options={"max_fevals": budget},
            verbose=False,
            quiet=True,
            seed=seed,  # the pymoo strategies (nsga2, nsga3) seed from this, not the globals
        )
    doc_keys = _kt_keys(json_path)
    seen: set[tuple[Any, ...]] = set()
    best, curve, times = math.inf, [], []
    for r in results:
        key = tuple(r[k] for k in doc_keys)
        if key in seen:
            continue
        seen.add(key)
        t = r.get("time")
        # ms -> us, as the trace device reports
        times.append(float(t) * 1000.0 if is_measured_time(t) else math.inf)
        best = min(best, times[-1])
        curve.append(best)
    return {"curve": curve[:budget], "times": times[:budget]}


@contextlib.contextmanager
def _seeded_kt_samplers(seed: int) -> Iterator[None]:
    """Seed the one random source of Kernel Tuner 1.5.0 that neither the globals nor its
    ``seed`` reach: bayes_opt's initial Latin hypercube (``scipy.stats.qmc.LatinHypercube``
    made without a generator draws fresh entropy, so the peer differed from run to run).
    The sampler and its draws are unchanged; only where its randomness comes from is."""
    try:
        from kernel_tuner.strategies import bayes_opt
    except ImportError:  # a Kernel Tuner without it: nothing to seed
        yield
        return
    lhs = bayes_opt.LatinHypercube
    # SciPy 1.15 named the generator argument ``rng``; before, it was ``seed``.
    kw = "rng" if "rng" in inspect.signature(lhs).parameters else "seed"
    bayes_opt.LatinHypercube = functools.partial(lhs, **{kw: np.random.default_rng(seed)})
    try:
        yield
    finally:
        bayes_opt.LatinHypercube = lhs


_KEYS: dict[str, list[str]] = {}


def _kt_keys(json_path: str) -> list[str]:
    if json_path not in _KEYS:
        with Path(json_path).open(encoding="utf-8") as fh:
            _KEYS[json_path] = list(json.load(fh)["tune_params_keys"])
    return _KEYS[json_path]


def _task(args: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, Any]]:
    """One run; one that raises comes back as its error instead of ending the benchmark."""
    t0 = time.perf_counter()
    try:
        out = _run(*args)
    except Exception as ex:
        out = {"error": f"{type(ex).__name__}: {ex}"}
    out["seconds"] = time.perf_counter() - t0
    out["seed"] = int(args[3])
    return args, out


def _run(kind: str, space: str, extra: str, seed: str, budget: str) -> dict[str, Any]:
    s, b = int(seed), int(budget)
    if kind in ("kernelstream", "cold"):
        settle = 0 if kind == "cold" else max(GAP_AT)
        out = _run_kernelstream(space, s, b, windows=int(extra) if extra else None, settle=settle)
    elif kind.startswith("fleet"):
        out = _run_fleet(space, s, int(kind.removeprefix("fleet")), windows=b)
    elif kind == "warm":
        out = _run_warm(space, extra, s, b)
    elif kind == "random":
        out = _run_random(space, s, b)
    else:
        out = _run_kt(extra, kind.removeprefix("kt:"), s, b)
    return out


# -- scoring ------------------------------------------------------------------------
def _evals_to(curve: Sequence[float], target: float) -> int | None:
    return next((i + 1 for i, b in enumerate(curve) if b <= target), None)


def _or_over(counts: Sequence[int | None], budget: int) -> list[int]:
    """Counts with a seed that never got there as "more than the budget" (budget + 1).

    So medians and percentiles of a method that fails cannot look good.
    """
    return [c if c is not None else budget + 1 for c in counts]


def _gap_at(curve: Sequence[float], n: int, opt: float) -> float | None:
    if not curve:
        return None
    b = curve[min(n, len(curve)) - 1]
    return b / opt - 1.0 if math.isfinite(b) else None


def _summary(curves: list[Sequence[float]], opt: float, budget: int) -> dict[str, Any]:
    out: dict[str, Any] = {"seeds": len(curves)}
    for thr in THRESHOLDS:
        tag = f"within_{round((thr - 1) * 100)}pct"
        hits = [_evals_to(c, opt * thr) for c in curves]
        vals = _or_over(hits, budget)
        out[tag] = {
            "median": float(np.median(vals)),
            "p90": float(np.percentile(vals, 90)),
            "reached": sum(h is not None for h in hits),
            "per_seed": hits,
        }
    # A method can end before the budget (Kernel Tuner's dual_annealing does on the A100
    # convolution space): its misses are then its own stopping rule, not the budget's.
    used = [len(c) for c in curves]
    out["evaluations"] = {
        "median": float(np.median(used)) if used else None,
        "ended_early_unreached": sum(
            n < budget and h is None
            for n, h in zip(used, out["within_5pct"]["per_seed"], strict=True)
        ),
    }
    for n in GAP_AT:
        gaps = [g for g in (_gap_at(c, n, opt) for c in curves) if g is not None]
        out[f"gap_after_{n}"] = {
            "median": float(np.median(gaps)) if gaps else None,
            "p90": float(np.percentile(gaps, 90)) if gaps else None,
        }
    return out


def _median_gap_curve(curves: list[Sequence[float]], opt: float, budget: int) -> list[float]:
    rows = []
    for c in curves:
        c = list(c) or [math.inf]
        c = c + [c[-1]] * (budget - len(c))
        rows.append([b / opt - 1.0 if math.isfinite(b) else np.nan for b in c[:budget]])
    return [float(x) for x in np.nanmedian(np.array(rows), axis=0)]


def run_benchmark(
    spaces_dir: Path,
    *,
    seeds: int,
    budget: int,
    strategies: Sequence[str],
    jobs: int,
    fleet_seeds: int,
    warm_seeds: int,
    fleet_windows: int | None = None,
    echo: Any = print,
) -> dict[str, Any]:
    fleet_windows = fleet_windows or 2 * budget
    from kernelstream.kernels.backends.trace import load_caches_in

    # Files that are not Kernel Tuner caches (a T4 results or metadata file beside each
    # cache, as the autotuning benchmark hub ships them) are skipped with their reason.
    loaded, unreadable = load_caches_in(spaces_dir)
    skipped = {p.name: why for p, why in unreadable.items()}
    for name, why in skipped.items():
        echo(f"skipped {name}: {why}")
    if not loaded:
        raise click.UsageError(
            f"no readable Kernel Tuner cache files in {spaces_dir}"
            + "".join(f"; {name}: {why}" for name, why in skipped.items())
        )
    files = [ts.path for ts in loaded]
    _SPACES.update((str(ts.path), ts) for ts in loaded)
    tmp = Path(tempfile.mkdtemp(prefix="ks-bench-tuning-"))
    try:
        plain: dict[str, str] = {}
        meta: dict[str, dict[str, Any]] = {}
        for p in files:
            ts = _space(str(p))
            truth = _truth(ts)
            opt = min(truth.values())
            if p.name.endswith(".gz"):
                target = tmp / p.name.removesuffix(".gz")
                with gzip.open(p, "rb") as src, target.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
                plain[str(p)] = str(target)
            else:
                plain[str(p)] = str(p)
            meta[str(p)] = {
                "file": p.name,
                "kernel": ts.kernel_name,
                "params": sorted(ts.space.params),
                "device": ts.device_name,
                "configs": ts.space.size(),
                "valid": len(truth),
                "optimum_us": opt,
                "start": ts.space.config_id(ts.default),
                "start_note": ts.start_note,
                "start_us": truth[ts.space.config_id(ts.default)],
                "start_vs_optimum": truth[ts.space.config_id(ts.default)] / opt,
                "share_within_5pct": sum(v <= opt * 1.05 for v in truth.values()) / len(truth),
            }
        tasks: list[tuple[str, ...]] = []
        for p in files:
            sp = str(p)
            sibling = _sibling(p, files, meta) if warm_seeds else None
            for seed in range(seeds):
                # The first fleet seeds' one-node figure comes from this same run.
                fleet_w = str(fleet_windows) if seed < fleet_seeds else ""
                tasks.append(("kernelstream", sp, fleet_w, str(seed), str(budget)))
                tasks.append(("random", sp, "", str(seed), str(budget)))
                tasks.extend(("kt:" + s, sp, plain[sp], str(seed), str(budget)) for s in strategies)
            tasks.extend(
                ("fleet" + str(FLEET_SIZES[-1]), sp, "", str(seed), str(fleet_windows))
                for seed in range(fleet_seeds)
            )
            # Seeds past ``seeds`` that the fleet's one node or the warm start's cold
            # side needs: one cold run serves both, as the kernelstream runs do.
            for seed in range(seeds, max(fleet_seeds, warm_seeds if sibling else 0)):
                fleet_w = str(fleet_windows) if seed < fleet_seeds else ""
                tasks.append(("cold", sp, fleet_w, str(seed), str(budget)))
            if sibling:
                meta[sp]["warm_from"] = Path(sibling).name
                tasks.extend(
                    ("warm", sp, sibling, str(seed), str(budget)) for seed in range(warm_seeds)
                )
        # Longest runs first, so no process idles at the end waiting on one straggler
        # (stable: seeds stay in order within each method and space).
        tasks.sort(key=lambda t: _COST_RANK.get(t[0], len(_COST_RANK)))
        echo(f"{len(tasks)} runs on {jobs} processes ({len(files)} spaces, {seeds} seeds)")
        results: dict[tuple[str, str], list[dict[str, Any]]] = {}
        failed: dict[tuple[str, str], list[str]] = {}
        t0 = time.perf_counter()
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for done, (args, out) in enumerate(pool.map(_task, tasks, chunksize=1), 1):
                if "error" in out:
                    failed.setdefault((args[0], args[1]), []).append(
                        f"seed {args[3]}: {out['error']}"
                    )
                    echo(f"  {args[0]} on {Path(args[1]).name}, seed {args[3]}: {out['error']}")
                else:
                    results.setdefault((args[0], args[1]), []).append(out)
                if done % 50 == 0:
                    echo(f"  {done}/{len(tasks)} runs, {time.perf_counter() - t0:.0f} s")
        wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    report: dict[str, Any] = {
        "benchmark": "tuning",
        "date": dt.date.today().isoformat(),
        "budget": budget,
        "seeds": seeds,
        "fleet_seeds": fleet_seeds,
        "fleet_windows": fleet_windows,
        "warm_seeds": warm_seeds,
        "wall_s": wall,
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
        },
        "kernel_tuner": _kt_version(),
        "skipped_files": skipped,
        "spaces": {},
    }
    for p in files:
        sp = str(p)
        opt = meta[sp]["optimum_us"]
        methods: dict[str, Any] = {}
        curves: dict[str, list[float]] = {}
        for kind in ["kernelstream", "random", *("kt:" + s for s in strategies), "warm"]:
            runs = results.get((kind, sp))
            if not runs:
                continue
            name = kind.removeprefix("kt:")
            methods[name] = _summary([r["curve"] for r in runs], opt, budget)
            methods[name]["seconds_per_run"] = float(np.mean([r["seconds"] for r in runs]))
            methods[name]["regret"] = regret_summary(
                [r["times"] for r in runs], meta[sp]["start_us"], opt, budget
            )
            curves[name] = _median_gap_curve([r["curve"] for r in runs], opt, budget)
        kt = [s for s in strategies if s in methods]
        best_kt = min(
            kt,
            key=lambda s: (
                methods[s]["within_5pct"]["median"],
                -methods[s]["within_5pct"]["reached"],
            ),
            default=None,
        )
        # Cold runs by seed: the kernelstream runs, then the extra seeds' cold runs.
        cold = {
            r["seed"]: r for kind in ("kernelstream", "cold") for r in results.get((kind, sp), [])
        }
        fleet: dict[str, Any] = {}
        for nodes in FLEET_SIZES:
            if nodes == 1:
                runs = [cold[s] for s in sorted(cold) if s < fleet_seeds]
            else:
                runs = results.get((f"fleet{nodes}", sp), [])
            rounds = [r.get("rounds_to_5") for r in runs]
            vals = _or_over(rounds, fleet_windows)
            fleet[f"{nodes}_node"] = {
                "median_windows_to_5pct": float(np.median(vals)) if vals else None,
                "reached": sum(r is not None for r in rounds),
                "seeds": len(rounds),
                "per_seed": rounds,
            }
        m1 = fleet[f"{FLEET_SIZES[0]}_node"]["median_windows_to_5pct"]
        mn = fleet[f"{FLEET_SIZES[-1]}_node"]["median_windows_to_5pct"]
        fleet["speedup"] = m1 / mn if m1 and mn and mn <= fleet_windows else None
        fleet["speedup_ci90"] = _speedup_interval(
            fleet[f"{FLEET_SIZES[0]}_node"]["per_seed"],
            fleet[f"{FLEET_SIZES[-1]}_node"]["per_seed"],
            fleet_windows,
        )
        fleet["paired"] = _paired_fleet(fleet, fleet_windows)
        report["spaces"][meta[sp]["file"]] = {
            **meta[sp],
            "methods": methods,
            "best_kernel_tuner": best_kt,
            "never_tune_regret": never_tune(meta[sp]["start_us"], opt, budget),
            # kernelstream against the best peer, random search included.
            "verdict": verdict(methods, ["random", *strategies]),
            "fleet": fleet,
            "warm": _warm_against_cold(results.get(("warm", sp), []), cold, opt, budget),
            "median_gap_curve": curves,
            # Runs that raised (method -> "seed N: error"): left out of every figure above.
            "failed_runs": {
                kind.removeprefix("kt:"): errs for (kind, q), errs in failed.items() if q == sp
            },
        }
    return report


def _sibling(p: Path, files: Sequence[Path], meta: dict[str, dict[str, Any]]) -> str | None:
    """Another GPU's cache of the same kernel over the same parameters, if the folder has one.

    A kernel of the same name tuned over other parameters teaches nothing here.
    """
    mine = meta[str(p)]
    return next(
        (
            str(q)
            for q in files
            if q != p
            and meta[str(q)]["kernel"] == mine["kernel"]
            and meta[str(q)]["params"] == mine["params"]
            and meta[str(q)]["device"] != mine["device"]
        ),
        None,
    )


def _paired_fleet(fleet: dict[str, Any], windows: int) -> dict[str, Any] | None:
    """Seed by seed, log(windows of one node / windows of the fleet); see paired_log_ratio."""
    one = fleet[f"{FLEET_SIZES[0]}_node"]["per_seed"]
    many = fleet[f"{FLEET_SIZES[-1]}_node"]["per_seed"]
    if len(one) != len(many):  # runs failed on one side: no pairs to speak of
        return None
    return paired_log_ratio(one, many, windows + 1)


def _warm_against_cold(
    warm: Sequence[dict[str, Any]], cold: dict[int, dict[str, Any]], opt: float, budget: int
) -> dict[str, Any] | None:
    """Evaluations to 5%, warm and cold, on the warm runs' seeds, and their paired log ratio."""
    pairs = [(r, cold[r["seed"]]) for r in warm if r["seed"] in cold]
    if not pairs:
        return None
    w = [_evals_to(r["curve"], opt * 1.05) for r, _ in pairs]
    c = [_evals_to(r["curve"], opt * 1.05) for _, r in pairs]
    return {
        "seeds": [r["seed"] for r, _ in pairs],
        "warm_per_seed": w,
        "cold_per_seed": c,
        "warm_median": float(np.median(_or_over(w, budget))),
        "cold_median": float(np.median(_or_over(c, budget))),
        "paired": paired_log_ratio(w, c, budget + 1),
    }


def _speedup_interval(
    one: Sequence[int | None], many: Sequence[int | None], windows: int
) -> list[float] | None:
    """90% bootstrap interval of the fleet speedup (ratio of the two medians).

    Seeds are resampled in pairs (seed s of one node with seed s of the fleet), as the
    runs share their devices' seeds. Medians of heavy-tailed counts from 20 seeds move a
    lot; the interval says how much, so a ratio near a target is read with it.
    """
    from scipy.stats import bootstrap

    a = np.array(_or_over(one, windows), dtype=np.float64)
    b = np.array(_or_over(many, windows), dtype=np.float64)
    if len(a) != len(b) or len(a) < 2 or (len(set(a)) < 2 and len(set(b)) < 2):
        return None
    res = bootstrap(
        (a, b),
        lambda x, y, axis=-1: np.median(x, axis=axis) / np.median(y, axis=axis),
        paired=True,
        vectorized=True,
        confidence_level=0.9,
        n_resamples=9999,
        method="percentile",
        random_state=np.random.default_rng(0),
    )
    return [float(res.confidence_interval.low), float(res.confidence_interval.high)]


def _kt_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("kernel_tuner")
    except Exception:
        return None


def format_table(report: dict[str, Any]) -> str:
    lines = []
    b = report["budget"]
    for name, sp in report["spaces"].items():
        lines.append(
            f"\n{name}: {sp['valid']} valid of {sp['configs']} configs, "
            f"{sp['share_within_5pct'] * 100:.2f}% within 5% of the optimum "
            f"({sp['optimum_us']:.1f} us); start {sp['start_vs_optimum']:.2f}x the optimum"
        )
        lines.append(
            f"{'method':<22}{'to 10% med':>11}{'p90':>6}{'hit':>7}"
            f"{'to 5% med':>11}{'p90':>6}{'hit':>7}{'gap@50':>9}{'gap@100':>9}"
        )
        for m, r in sp["methods"].items():
            w10, w5 = r["within_10pct"], r["within_5pct"]
            g50, g100 = r["gap_after_50"]["median"], r["gap_after_100"]["median"]
            label = m + (" *" if m == sp["best_kernel_tuner"] else "")
            lines.append(
                f"{label:<22}{_n(w10['median'], b):>11}{_n(w10['p90'], b):>6}"
                f"{w10['reached']:>4}/{r['seeds']:<2}{_n(w5['median'], b):>11}"
                f"{_n(w5['p90'], b):>6}{w5['reached']:>4}/{r['seeds']:<2}"
                f"{_pct(g50):>9}{_pct(g100):>9}"
            )
        lines.extend(_regret_lines(sp))
        f1, f4, w = sp["fleet"]["1_node"], sp["fleet"]["4_node"], report["fleet_windows"]
        speedup = sp["fleet"].get("speedup")
        lines.append(
            f"fleet: windows per node to within 5% (median, at most {w}): 1 node "
            f"{_n(f1['median_windows_to_5pct'], w)} ({f1['reached']}/{f1['seeds']}), 4 nodes "
            f"sharing {_n(f4['median_windows_to_5pct'], w)} ({f4['reached']}/{f4['seeds']})"
            + (f", {speedup:.1f}x fewer" if speedup else "")
            + (
                f" (90% bootstrap interval over seeds {ci[0]:.1f}-{ci[1]:.1f}x)"
                if speedup and (ci := sp["fleet"].get("speedup_ci90"))
                else ""
            )
            + _paired_text(sp["fleet"].get("paired"), "one node / four")
        )
        for m, r in sp["methods"].items():
            if early := r.get("evaluations", {}).get("ended_early_unreached"):
                lines.append(
                    f"{m}: ended before the budget without getting within 5% on {early} of "
                    f"{r['seeds']} seeds (median {r['evaluations']['median']:g} evaluations)"
                )
        for m, errs in sp.get("failed_runs", {}).items():
            lines.append(f"{m}: {len(errs)} runs failed and are left out, e.g. {errs[0]}")
        if warm := sp.get("warm"):
            wn = len(warm["seeds"])
            lines.append(
                f"warm start from {sp.get('warm_from')}: median evaluations to 5% "
                f"{_n(warm['warm_median'], b)} "
                f"({sum(x is not None for x in warm['warm_per_seed'])}/{wn}) vs cold "
                f"{_n(warm['cold_median'], b)} "
                f"({sum(x is not None for x in warm['cold_per_seed'])}/{wn}) on the same seeds"
                + _paired_text(warm.get("paired"), "warm / cold")
            )
        elif report.get("warm_seeds"):
            lines.append(
                "warm start: no other GPU of this kernel over the same parameters in the folder"
            )
    lines.extend(
        f"\nskipped {name} (not a Kernel Tuner cache): {why}"
        for name, why in report.get("skipped_files", {}).items()
    )
    lines.append(
        "\n* = best Kernel Tuner strategy on that space; '>B' = not reached within budget B"
    )
    lines.extend(verdict_lines(report))
    return "\n".join(lines)


def _paired_text(paired: dict[str, Any] | None, what: str) -> str:
    """``; paired mean log(what) +0.12 (90% interval ...), 1.13x`` or nothing."""
    if not paired:
        return ""
    m, (lo, hi) = paired["mean"], paired["ci90"]
    return (
        f"; paired mean log({what}) {m:+.2f} (90% interval {lo:+.2f} to {hi:+.2f}), "
        f"{math.exp(m):.2f}x ({math.exp(lo):.2f}-{math.exp(hi):.2f}x) over {paired['seeds']} seeds"
    )


def _regret_lines(sp: dict[str, Any]) -> list[str]:
    """The online cost table of one space (bench/tuning_score.py says how it is counted)."""
    rows = {m: r.get("regret", {}) for m, r in sp["methods"].items()}
    rows["never tune"] = sp.get("never_tune_regret", {})
    cols = [k for k in ("after_50", "after_100", "after_200") if k in rows["never tune"]]
    if not cols:
        return []
    lines = [
        "online cost: cumulative regret, time run / the same windows at the optimum "
        "(median over seeds)",
        f"{'method':<22}" + "".join(f"{'after ' + c.removeprefix('after_'):>11}" for c in cols),
    ]
    for m, r in rows.items():
        lines.append(f"{m:<22}" + "".join(f"{_x(r.get(c)):>11}" for c in cols))
    return lines


def verdict_lines(report: dict[str, Any]) -> list[str]:
    """One line per space: kernelstream beats / ties / loses against the best peer."""
    lines = ["", "kernelstream against the best peer (evaluations to 5%: seeds reached, median):"]
    for name, sp in report["spaces"].items():
        v = sp.get("verdict")
        if v is None:
            lines.append(f"{name}: no verdict (no kernelstream or no peer runs)")
            continue
        b = report["budget"]
        lines.append(
            f"{name}: {v['result']} {v['peer']} (reached {v['reached'][0]} vs "
            f"{v['reached'][1]} of {sp['methods']['kernelstream']['seeds']}, median "
            f"{_n(v['median'][0], b)} vs {_n(v['median'][1], b)})"
        )
    return lines


def problems(report: dict[str, Any]) -> list[str]:
    """What makes the run incomplete: files skipped and runs that failed or are missing."""
    out = [f"skipped {name}" for name in report.get("skipped_files", {})]
    for name, sp in report["spaces"].items():
        out.extend(
            f"{name}: {len(errs)} {m} runs failed" for m, errs in sp.get("failed_runs", {}).items()
        )
        if sp.get("verdict") is None:
            out.append(f"{name}: no verdict")
    return out


def _n(x: float | None, budget: int) -> str:
    if x is None:
        return "-"
    return f">{budget}" if x > budget else f"{x:g}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def plot(report: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for name, sp in report["spaces"].items():
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
        # tab20: one colour per peer (tab10's ten ran out with eleven methods).
        colours = plt.get_cmap("tab20")
        for k, (m, curve) in enumerate(sp["median_gap_curve"].items()):
            xs = np.arange(1, len(curve) + 1)
            ours = m == "kernelstream"
            colour = "black" if ours else colours((2 * k) % 20 + (2 * k) // 20 % 2)
            # Gaps of 0 (the optimum found) are drawn at the 0.1% floor of the log axis.
            ax.plot(
                xs,
                np.maximum(np.array(curve) * 100, 0.1),
                label=m,
                color=colour,
                linewidth=2.4 if ours else 1.2,
            )
        ax.axhline(5, color="grey", linestyle=":", linewidth=1)
        ax.text(1, 5.4, "5%", color="grey", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylim(0.08, None)
        ax.set_xlabel("unique configurations evaluated")
        ax.set_ylabel("best-so-far gap to optimum, % (median over seeds)")
        ax.set_title(f"{sp['kernel']} on {sp['device']}", fontsize=10)
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out.parent / f"{out.stem}-{name.split('.')[0]}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


@click.command("tuning")
@click.option(
    "--spaces",
    "spaces_dir",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    default=None,
    help="Directory of Kernel Tuner cache files (default: ../shared/data/tuning-spaces).",
)
@click.option("--json", "json_out", type=click.Path(path_type=Path), required=True)
@click.option("--seeds", type=int, default=20, show_default=True)
@click.option("--budget", type=int, default=200, show_default=True, help="Evaluations per run.")
@click.option(
    "--strategies",
    default=",".join(KT_STRATEGIES),
    show_default=True,
    help="Kernel Tuner strategies to run as peers (comma-separated).",
)
@click.option(
    "--fleet-seeds",
    type=int,
    default=40,
    show_default=True,
    help="Seeds for the fleet comparison (one node against four, paired seed by seed).",
)
@click.option(
    "--fleet-windows",
    type=int,
    default=None,
    help="Windows per node for the fleet comparison, any fleet size [default: 2 x budget].",
)
@click.option(
    "--warm-seeds",
    type=int,
    default=20,
    show_default=True,
    help="Seeds for the warm start against cold (paired seed by seed).",
)
@click.option("--no-warm", is_flag=True, help="Skip the cross-device warm-start runs.")
@click.option("--jobs", type=int, default=os.cpu_count() or 1, show_default=True)
@click.option(
    "--results-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("bench/results"),
    show_default=True,
    help="Where the dated copy, the table and the plots go.",
)
def command(
    spaces_dir: Path | None,
    json_out: Path,
    seeds: int,
    budget: int,
    strategies: str,
    fleet_seeds: int,
    fleet_windows: int | None,
    warm_seeds: int,
    no_warm: bool,
    jobs: int,
    results_dir: Path,
) -> None:
    """Tuner vs random search and Kernel Tuner's strategies on measured search spaces."""
    from kernelstream.kernels.backends.trace import default_tuning_spaces_dir

    if any(strategies.split(",")):
        try:
            import kernel_tuner  # noqa: F401
        except ImportError as exc:
            raise click.UsageError(
                "the peers need Kernel Tuner: pip install -e '.[bench]' (or --strategies '')"
            ) from exc
    report = run_benchmark(
        spaces_dir or default_tuning_spaces_dir(),
        seeds=seeds,
        budget=budget,
        strategies=[s for s in strategies.split(",") if s],
        jobs=jobs,
        fleet_seeds=fleet_seeds,
        fleet_windows=fleet_windows,
        warm_seeds=0 if no_warm else warm_seeds,
        echo=lambda m: click.echo(m, err=True),
    )
    table = format_table(report)
    click.echo(table)
    results_dir.mkdir(parents=True, exist_ok=True)
    dated = _dated(results_dir, report["date"], json_out)
    json_out.parent.mkdir(parents=True, exist_ok=True)
    json_out.write_text(json.dumps(report, indent=1))
    if dated.resolve() != json_out.resolve():
        shutil.copyfile(json_out, dated)
    dated.with_suffix(".txt").write_text(table + "\n")
    for p in plot(report, dated):
        click.echo(f"plot: {p}", err=True)
    if trouble := problems(report):
        # Figures with runs missing are not the figures asked for: a script or CI job
        # running the benchmark must see it, not only a reader of the table.
        click.echo(f"incomplete run: {'; '.join(trouble)}", err=True)
        raise click.exceptions.Exit(1)


def _dated(results_dir: Path, date: str, json_out: Path) -> Path:
    """Where the dated copy goes: ``json_out`` itself when it is one, else a new name.

    An earlier run of the same day keeps its files: the next one is ``-run2``, ``-run3``...
    """
    if json_out.resolve().parent == results_dir.resolve() and json_out.name.startswith(
        f"tuning-{date}"
    ):
        return json_out
    return Path(f"{dated_stem(results_dir, 'tuning', date)}.json")
