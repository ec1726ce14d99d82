"""Per-round option shares and letter shares of a run's decision traces (the table in README.md).

    python docs/runs/cleanup-tiny-fixed-letters-cpu/analyse.py RUN_DIR > choices_by_round.json

Reads RUN_DIR/decisions/round_*.jsonl (one record per decision: `choice`, `option`, `aid`, `n_letters`,
`outcome`) and, for evaluations, RUN_DIR/decisions/eval*.jsonl. Prints JSON: per file, the decisions, the share
of each option type, the share of each letter among menus of >= 2 letters, the per-agent option shares, and the
start-failure share, and the specialisation index (`jaxopt_marl.audit`).
"""

import collections
import glob
import json
import os
import sys

from jaxopt_marl import audit


def summarise(path):
    recs = [json.loads(line) for line in open(path)]
    names, counts = audit.option_histogram(recs)  # int64[N, options]
    letter = collections.Counter(r["choice"] for r in recs if r["n_letters"] >= 2)
    outcome = collections.Counter(r["outcome"] for r in recs)
    total = counts.sum(axis=0)

    def share(c, d):
        return {k: round(float(v) / d, 4) for k, v in sorted(c.items())}

    return {
        "decisions": len(recs),
        "option_share": share(dict(zip(names, total)), max(len(recs), 1)),
        "letter_share_real_choices": share(letter, max(sum(letter.values()), 1)),
        "outcome_share": share(outcome, max(len(recs), 1)),
        "per_agent_option_share": {
            a: share(dict(zip(names, row)), max(int(row.sum()), 1)) for a, row in enumerate(counts)
        },
        "specialisation_index": round(audit.specialisation_index(counts), 4),
    }


def main():
    run = sys.argv[1]
    files = sorted(glob.glob(os.path.join(run, "decisions", "*.jsonl")))
    print(json.dumps({os.path.basename(f): summarise(f) for f in files}, indent=1))


if __name__ == "__main__":
    main()
