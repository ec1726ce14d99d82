"""The table of README part 4 from ``format_probe.json`` and its responses (exact Clopper-Pearson 95% CIs).

python docs/runs/frozen-smollm2-cpu/analyse_format.py format_probe.json format_probe_responses.jsonl
"""

import collections
import json
import sys

from scipy.stats import binomtest


def main(summary_path: str, responses_path: str) -> None:
    with open(summary_path) as fh:
        per_game = json.load(fh)["per_game"]
    rows = [json.loads(line) for line in open(responses_path)]
    variants = list(next(iter(per_game.values()))["variants"])
    print("| game | decisions | " + " | ".join(variants) + " |")
    print("|---|---|" + "---|" * len(variants))
    for game, g in per_game.items():
        cells = []
        for v in variants:
            ok, n = g["variants"][v]["ok"], g["decisions"]
            ci = binomtest(ok, n).proportion_ci(confidence_level=0.95, method="exact")
            cells.append(f"{ok / n:.2f} [{ci.low:.2f}, {ci.high:.2f}]")
        print(f"| {game} | {g['decisions']} | " + " | ".join(cells) + " |")
    print()
    print("failure reasons per variant, all games together:")
    for v in variants:
        c = collections.Counter(r["parse"] for r in rows if r["variant"] == v)
        print(f"  {v}: {dict(c.most_common())}")
    print()
    print("what follows 'choice:' in prefix_choice answers that did not parse (first word, all games):")
    c = collections.Counter()
    for r in rows:
        if r["variant"] == "prefix_choice" and r["parse"] != "ok":
            words = r["response"].split()
            c[words[0] if words else "<empty>"] += 1
    print("  " + ", ".join(f"{w!r}: {k}" for w, k in c.most_common(15)))


if __name__ == "__main__":
    main(*sys.argv[1:3])
