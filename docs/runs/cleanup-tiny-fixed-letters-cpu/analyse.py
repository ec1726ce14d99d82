"""Per-round option shares and letter shares of a run's decision traces (the table in README.md).

    python docs/runs/cleanup-tiny-fixed-letters-cpu/analyse.py RUN_DIR > choices_by_round.json

Reads RUN_DIR/decisions/round_*.jsonl (one record per decision: `choice`, `option`, `aid`, `n_letters`,
`outcome`) and, for evaluations, RUN_DIR/decisions/eval*.jsonl. Prints JSON: per file, the decisions, the share
of each option type, the share of each letter among menus of >= 2 letters, the per-agent option shares, and the
start-failure share.
"""

import collections
import glob
import json
import os
import sys


def summarise(path):
    opt, letter, outcome = (collections.Counter() for _ in range(3))
    agents = collections.defaultdict(collections.Counter)
    n = real = 0
    for line in open(path):
        r = json.loads(line)
        n += 1
        opt[r["option"] or "none"] += 1
        outcome[r["outcome"]] += 1
        agents[r["aid"]][r["option"] or "none"] += 1
        if r["n_letters"] >= 2:
            real += 1
            letter[r["choice"]] += 1
    share = lambda c, d: {k: round(v / d, 4) for k, v in sorted(c.items())}  # noqa: E731
    return {
        "decisions": n,
        "option_share": share(opt, n),
        "letter_share_real_choices": share(letter, max(real, 1)),
        "outcome_share": share(outcome, n),
        "per_agent_option_share": {a: share(c, sum(c.values())) for a, c in sorted(agents.items())},
    }


def main():
    run = sys.argv[1]
    files = sorted(glob.glob(os.path.join(run, "decisions", "*.jsonl")))
    print(json.dumps({os.path.basename(f): summarise(f) for f in files}, indent=1))


if __name__ == "__main__":
    main()
