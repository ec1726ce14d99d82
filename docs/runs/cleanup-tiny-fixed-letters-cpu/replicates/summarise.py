"""Replicates of the fixed-letters diagnostic on one frozen base: per training seed and pooled (README.md).

    python docs/runs/cleanup-tiny-fixed-letters-cpu/replicates/summarise.py \
        docs/runs/cleanup-tiny-fixed-letters-cpu docs/runs/cleanup-tiny-fixed-letters-cpu/replicates/seed1 ... \
        > docs/runs/cleanup-tiny-fixed-letters-cpu/replicates/summary.json

Each RUN_DIR holds a run's ``metrics.jsonl`` and ``eval.json`` (with ``stats``). Prints JSON: per run, the seed,
the cohort means by round (apples per 150 steps, K = 8), the mean over rounds 0-19 (the replicates' budget), the
evaluated trained and frozen-base returns with their 95% bootstrap CIs and the Mann-Whitney p; then the lift
(trained minus base mean) as mean ± sample std over the runs, and both policies pooled over every run's
held-out episodes with one Mann-Whitney test (``jaxopt_marl.stats``, paper §6.1); the base's episodes enter
once if every run evaluated the same ones.
"""

import json
import os
import sys

import numpy as np

from jaxopt_marl import stats

ROUNDS = 20  # the replicates' budget, the same as the original seed-0 run's


def one(run_dir):
    cfg = json.load(open(os.path.join(run_dir, "config.json")))
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    ev = json.load(open(os.path.join(run_dir, "eval.json")))["stats"]
    means = [round(r["train/return_mean"], 2) for r in rows]
    return {
        "run": run_dir,
        "seed": cfg["seed"],
        "model": cfg["model"],
        "rounds": cfg["rounds"],
        "cohort_means": means,
        f"cohort_mean_rounds_0_{ROUNDS - 1}": round(float(np.mean(means[:ROUNDS])), 2),
        "cohort_mean_first_10": round(float(np.mean(means[:10])), 2),
        "cohort_mean_last_10": round(float(np.mean(means[ROUNDS - 10 : ROUNDS])), 2),
        "trained": {k: ev["trained"][k] for k in ("mean", "std", "ci", "values")},
        "base": {k: ev["base"][k] for k in ("mean", "std", "ci", "values")},
        "p_value": ev["mann_whitney"]["p_value"],
        "u": ev["mann_whitney"]["u"],
        "lift": round(ev["trained"]["mean"] - ev["base"]["mean"], 2),
    }


def main(dirs):
    runs = [one(d) for d in dirs]
    lifts = np.array([r["lift"] for r in runs])
    trained = [v for r in runs for v in r["trained"]["values"]]
    # One frozen base on the same held-out seeds: if its episodes are the same in every run, pool them once (the
    # Mann-Whitney test would otherwise count each base episode once per run).
    same_base = all(r["base"]["values"] == runs[0]["base"]["values"] for r in runs)
    base = list(runs[0]["base"]["values"]) if same_base else [v for r in runs for v in r["base"]["values"]]
    out = {
        "runs": runs,
        "lift_mean": round(float(lifts.mean()), 2),
        "lift_std": round(float(lifts.std(ddof=1)), 2) if len(lifts) > 1 else None,
        "base_identical_across_runs": same_base,
        "pooled_trained": stats.summarize(trained, "trained"),
        "pooled_base": stats.summarize(base, "frozen_base"),
        "pooled_mann_whitney": stats.mann_whitney(trained, base, "trained", "frozen_base"),
    }
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv[1:])
