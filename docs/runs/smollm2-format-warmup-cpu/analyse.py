"""The README's tables from ``warmup.py`` outputs (exact Clopper-Pearson 95% CIs on the parse rate).

python docs/runs/smollm2-format-warmup-cpu/analyse.py warmup.json [warmup_base.json ...]
"""

import json
import sys

from scipy.stats import binomtest


def table(path: str) -> None:
    with open(path) as fh:
        d = json.load(fh)
    print(
        f"### {path}: letter target {d.get('letter_target', 'uniform')}, lr {d['lr']}, batch {d['batch']}, "
        f"{d['steps']} steps, {d['train_seconds']:.0f} s of training"
    )
    print()
    print(
        "| after step | game | parse ok [95% CI] | state = game label | choice_only entropy / log n "
        "| choice_only P(A) (uniform) | TV from base | top letter of parsed |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for p in d["points"]:
        for g, r in p["per_game"].items():
            n = r["held_out"]
            ok = r["parse_counts"].get("ok", 0)
            ci = binomtest(ok, n).proportion_ci(confidence_level=0.95, method="exact")
            tv = r.get("choice_only_tv_base_to_warm")
            top = r["top_letter_share_of_parsed"]
            print(
                f"| {p['step']} | {g} | {ok}/{n} = {ok / n:.2f} [{ci.low:.2f}, {ci.high:.2f}] "
                f"| {r['state_label_rate']:.2f} | {r['choice_only_entropy_vs_uniform']:.2f} "
                f"| {r['choice_only_p_letter_A']:.2f} ({r['uniform_p_letter_A']:.2f}) "
                f"| {'-' if tv is None else f'{tv:.2f}'} | {'-' if top is None else f'{top:.2f}'} |"
            )
    print()


if __name__ == "__main__":
    for path in sys.argv[1:]:
        table(path)
