"""Paired per-seed comparison of tuner variants: how every change in docs/tuning-log.md was judged.

``kernelstream bench tuning`` scores *the* tuner against its peers on 20 seeds. Deciding
whether a change to ``ModelGuidedSearch`` helps needs more: the A100 convolution space's
per-seed counts are heavy-tailed, and blocks of 80 seeds differ by as much as most
variants do (docs/tuning-log.md). So a variant is run on the same seeds as the base, one
closed-loop run per seed (the benchmark's own ``_loop``: trace devices, noisy launches,
windows), and the two are compared seed by seed: the mean log ratio of evaluations to
within 5% and its standard error, beside the medians and the seeds within 200 and 60.

    python -m kernelstream.bench.tuning_variants run --seeds 120-280 --out base.json
    python -m kernelstream.bench.tuning_variants run --seeds 120-280 \\
        --kwargs '{"arm_bonus": 1.0}' --out bonus.json
    python -m kernelstream.bench.tuning_variants compare base.json bonus.json

``--kwargs`` are ``ModelGuidedSearch`` arguments (JSON). A seed that does not get within
5% in ``--windows`` windows per node counts as ``--windows + 1`` evaluations (and
windows), as in the tuning log's scratch figures. With ``--nodes 4`` compare ``windows``
(``--metric windows``): that is the fleet figure. 80 one-node A100 seeds take about 5
minutes with ``--jobs 2`` on this 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

DEFAULT_SPACE = "../shared/data/tuning-spaces/convolution_milo_A100.json.gz"
WITHIN = (200, 60)


def run_seed(
    space: str,
    seed: int,
    nodes: int,
    kwargs: Mapping[str, Any],
    windows: int,
    warm_from: str | None = None,
) -> dict[str, Any]:
    """One closed-loop run: evaluations (unique configs) and windows per node to within 5%.

    With ``warm_from`` (another GPU's cache file of the same kernel) the same tuner first
    tunes that space on a node of its own (:func:`bench.tuning.tuned_first`), as the
    benchmark's warm runs do; pass ``{"warm_start": true}`` in ``kwargs`` for the search
    to use it.
    """
    from kernelstream.agents.logic.search import ModelGuidedSearch
    from kernelstream.agents.logic.tuning import Tuner
    from kernelstream.bench.tuning import _loop, tuned_first

    tuner = Tuner(strategy=ModelGuidedSearch(seed=seed, **kwargs))
    if warm_from is not None:
        tuner = tuned_first(warm_from, seed, tuner)
    loop = _loop([space], seed, nodes, budget=0, windows=windows, tuner=tuner)
    target = min(loop.truth.values()) * 1.05
    return {
        "seed": seed,
        "evals": loop.trace.evaluations_to(target),
        "windows": loop.trace.rounds_to(target),
    }


def run(
    space: str,
    seeds: Sequence[int],
    nodes: int = 1,
    kwargs: Mapping[str, Any] | None = None,
    windows: int = 400,
    jobs: int = 1,
    warm_from: str | None = None,
) -> dict[str, Any]:
    """Every seed of ``seeds``, ``jobs`` processes; the document ``compare`` reads."""
    kwargs = dict(kwargs or {})
    args = [(space, s, nodes, kwargs, windows, warm_from) for s in seeds]
    if jobs > 1:
        with ProcessPoolExecutor(jobs) as pool:
            rows = list(pool.map(run_seed, *zip(*args, strict=True)))
    else:
        rows = [run_seed(*a) for a in args]
    return {
        # Resolved: a variant of the code runs from its own checkout, where the default
        # relative path names another string for the same file.
        "space": str(Path(space).resolve()),
        "nodes": nodes,
        "kwargs": kwargs,
        "windows": windows,
        "warm_from": None if warm_from is None else str(Path(warm_from).resolve()),
        "commit": _commit(),
        "seeds": rows,
    }


def compare(
    base: Mapping[str, Any], variant: Mapping[str, Any], metric: str = "evals"
) -> dict[str, Any]:
    """Paired comparison over the seeds both runs have (a miss counts as windows + 1).

    ``mean_log_ratio`` is the mean over seeds of log(variant / base): negative means the
    variant needs fewer; ``se`` is its standard error.
    """
    if metric not in ("evals", "windows"):
        raise ValueError(f"metric must be 'evals' or 'windows', got {metric!r}")

    def where(doc: Mapping[str, Any]) -> tuple[Path, int]:
        return Path(doc["space"]).resolve(), int(doc["nodes"])

    if where(variant) != where(base):
        raise ValueError("compare runs of the same space and number of nodes")

    def counts(doc: Mapping[str, Any]) -> dict[int, int]:
        miss = int(doc["windows"]) + 1
        return {r["seed"]: miss if r[metric] is None else int(r[metric]) for r in doc["seeds"]}

    a, b = counts(base), counts(variant)
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        raise ValueError("the two runs share fewer than 2 seeds")
    logs = [math.log(b[s] / a[s]) for s in seeds]

    def side(c: dict[int, int]) -> dict[str, Any]:
        values = [c[s] for s in seeds]
        return {"median": statistics.median(values)} | {
            f"within_{n}": sum(v <= n for v in values) for n in WITHIN
        }

    return {
        "metric": metric,
        "seeds": len(seeds),
        "base": side(a),
        "variant": side(b),
        "mean_log_ratio": statistics.mean(logs),
        "se": statistics.stdev(logs) / math.sqrt(len(logs)),
    }


def format_comparison(c: Mapping[str, Any]) -> str:
    def side(s: Mapping[str, Any]) -> str:
        within = ", ".join(f"{s[f'within_{n}']} within {n}" for n in WITHIN)
        return f"median {s['median']:g}, {within}"

    return (
        f"{c['seeds']} seeds, {c['metric']} to within 5%: base {side(c['base'])}; "
        f"variant {side(c['variant'])}; mean log ratio {c['mean_log_ratio']:+.3f} "
        f"(se {c['se']:.3f})"
    )


def _commit() -> str | None:
    try:
        out = subprocess.run(
            # "-dirty" when the working tree has changes: a scratch variant's code
            ["git", "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def _seed_range(text: str) -> range:
    lo, sep, hi = text.partition("-")
    try:
        return range(int(lo), int(hi)) if sep else range(int(lo), int(lo) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds are FROM-TO (TO excluded), got {text!r}") from None


def _kwargs(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--kwargs is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--kwargs must be a JSON object")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kernelstream.bench.tuning_variants", description=__doc__
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run one variant on a range of seeds")
    r.add_argument("--space", default=DEFAULT_SPACE, help="a Kernel Tuner cache file")
    r.add_argument("--seeds", type=_seed_range, default=range(120, 200), help="FROM-TO")
    r.add_argument("--nodes", type=int, default=1)
    r.add_argument("--kwargs", type=_kwargs, default={}, help="ModelGuidedSearch arguments")
    r.add_argument("--windows", type=int, default=400, help="windows per node at most")
    r.add_argument("--jobs", type=int, default=2)
    r.add_argument(
        "--warm-from",
        default=None,
        help="another GPU's cache file of the same kernel, tuned first (warm start)",
    )
    r.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("compare", help="compare two runs seed by seed")
    c.add_argument("base", type=Path)
    c.add_argument("variant", type=Path)
    c.add_argument("--metric", choices=("evals", "windows"), default="evals")
    args = parser.parse_args(argv)
    if args.cmd == "run":
        if not Path(args.space).is_file():
            parser.error(f"no cache file at {args.space}")
        if args.warm_from is not None and not Path(args.warm_from).is_file():
            parser.error(f"no cache file at {args.warm_from}")
        doc = run(
            args.space,
            args.seeds,
            args.nodes,
            args.kwargs,
            args.windows,
            args.jobs,
            args.warm_from,
        )
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{len(doc['seeds'])} seeds -> {args.out}")
        return 0
    try:
        docs = [json.loads(p.read_text()) for p in (args.base, args.variant)]
        print(format_comparison(compare(docs[0], docs[1], metric=args.metric)))
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
