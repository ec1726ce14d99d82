"""The table of README.md from responses.jsonl: ``python docs/runs/frozen-smollm2-cpu/analyse.py``.

Per game: parse outcomes, the failure rate with its exact 95% interval (jaxopt_marl.stats.rate_ci), how many
``ok`` parses read a letter out of an echoed menu (a line ``X) <menu phrase>`` elsewhere in the response), how
many ``no_choice`` responses open with an echoed menu line (its letter as in the menu, or another one), and how
many decisions ended as ``wait`` (a failed parse makes the agent wait)."""

import collections
import json
import re
from pathlib import Path

from jaxopt_marl.stats import rate_ci

MENU_LINE = re.compile(r"^\s*([A-Za-z])\)\s+(\S.*)$")


def echo(line: str, menu: list[str]) -> str | None:
    """'same_letter' / 'other_letter' if ``line`` is a menu entry (a cut-off phrase counts), else None."""
    m = MENU_LINE.match(line)
    if not m:
        return None
    letter, phrase = m.group(1).upper(), m.group(2).strip().lower()
    kinds = set()
    for entry in menu:
        el, ep = entry.split(") ", 1)
        ep = ep.strip().lower()
        if ep.startswith(phrase) or phrase.startswith(ep):
            kinds.add("same_letter" if el == letter else "other_letter")
    return "same_letter" if "same_letter" in kinds else ("other_letter" if kinds else None)


rows = [json.loads(x) for x in open(Path(__file__).with_name("responses.jsonl"))]
print("| game | decisions | ok | no_choice | failure rate [95% CI] | ok from an echoed menu | no_choice opening with "
      "a menu line (same / other letter) | wait |")
print("|---|---|---|---|---|---|---|---|")
for game in dict.fromkeys(r["game"] for r in rows):
    rs = [r for r in rows if r["game"] == game]
    c = collections.Counter(r["parse"] for r in rs)
    fail = rate_ci(len(rs) - c["ok"], len(rs))
    ok_echo = sum(any(echo(ln, r["menu"]) for ln in r["response"].splitlines()) for r in rs if r["parse"] == "ok")
    first = collections.Counter(
        echo(next((ln for ln in r["response"].splitlines() if ln.strip()), ""), r["menu"])
        for r in rs
        if r["parse"] == "no_choice"
    )
    print(
        f"| {game} | {len(rs)} | {c['ok']} | {c['no_choice']} | {fail['rate']:.3f} [{fail['ci'][0]:.3f}, "
        f"{fail['ci'][1]:.3f}] | {ok_echo} | {first['same_letter']} / {first['other_letter']} | "
        f"{sum(r['option'] == 'wait' for r in rs)} |"
    )
