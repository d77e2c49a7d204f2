"""How well each model of ``ModelGuidedSearch`` ranks a space's fast configs from samples.

A diagnostic for choosing the tuner's model, apart from the search around it: each model
is fitted to the true mean durations (log) of ``n`` configurations drawn at random from a
Kernel Tuner cache file, and scored on the configurations it was not given:

- ``corr``: correlation of its mean prediction with the true log durations;
- ``rank``: where the fastest unmeasured configuration comes in its ranking (0 = first);
- ``top20``: the best true duration among its 20 best-ranked, relative to the optimum.

    python -m kernelstream.bench.model_fit --samples 100,300 --seeds 3

docs/tuning-log.md ("A pairwise model") quotes the medians over 5 seeds.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kernelstream.agents.logic.search import ModelGuidedSearch
from kernelstream.kernels.backends.trace import default_tuning_spaces_dir, load_cache

MODELS = ("trees", "pairwise")


def score(ts: Any, model: str, n: int, seed: int) -> dict[str, float]:
    """``corr``, ``rank`` and ``top20`` (above) of ``model`` fitted on ``n`` random configs
    of ``ts`` (a loaded cache file, ``kernels.backends.trace.load_cache``)."""
    strategy = ModelGuidedSearch(model=model, seed=seed)
    idx = strategy.index(ts.space)
    truth = {idx.position[cid]: float(t.mean()) for cid, t in ts.times_us.items()}
    known = np.array(sorted(truth))
    rng = np.random.default_rng(seed)
    rows = rng.choice(known, size=n, replace=False)
    mu, _, _ = strategy._fit(idx.features, [(int(i), truth[int(i)]) for i in rows], [], rng, idx)
    unseen = np.setdiff1d(known, rows)
    y = np.log([truth[int(i)] for i in unseen])
    order = np.argsort(mu[unseen], kind="stable")
    opt = min(truth.values())
    return {
        "corr": float(np.corrcoef(mu[unseen], y)[0, 1]),
        "rank": float(np.flatnonzero(order == int(np.argmin(y)))[0]),
        "top20": float(math.exp(y[order[:20]].min()) / opt),
    }


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spaces", default=None, help="folder of cache files")
    ap.add_argument("--samples", default="100,300", help="sample sizes, comma-separated")
    ap.add_argument("--seeds", type=int, default=1)
    args = ap.parse_args(argv)
    paths = sorted(Path(args.spaces or default_tuning_spaces_dir()).glob("*.json.gz"))
    print(f"{'space':26} {'model':9} {'n':>4} {'corr':>6} {'rank':>7} {'top20':>6}")
    for path in paths:
        ts = load_cache(path)  # once per file: every size, model and seed reads it
        for n in (int(x) for x in args.samples.split(",")):
            for model in MODELS:
                got = [score(ts, model, n, s) for s in range(args.seeds)]
                med = {k: float(np.median([g[k] for g in got])) for k in got[0]}
                print(
                    f"{path.name.split('.')[0]:26} {model:9} {n:>4} {med['corr']:6.3f} "
                    f"{med['rank']:7.0f} {med['top20']:6.3f}"
                )


if __name__ == "__main__":
    main()
