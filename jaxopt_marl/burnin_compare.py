"""The uniform burn-in next to the frozen-LLM control (paper §5.1): coverage, guards, cost. No JAX.

§5.1: "A control experiment replacing the uniform policy with a frozen pretrained LLM collapses coverage -- its
narrow deterministic attractor never reaches dish/plate/deliver states -- yielding 2 guards versus uniform's 36
at roughly 400x the cost." :func:`compare` reads two burn-in directories (``records.parquet``, ``guards.jsonl``,
``burnin.json``: :func:`jaxopt_marl.burnin.write_outputs`) of the same game, seed, episode plan, episode length
and guard threshold, one ``uniform`` and one ``llm`` (``python -m experiments.burnin --policy uniform|llm``), and
:func:`write_compare` writes ``compare.json`` (:func:`compare`'s dict) and ``compare.md`` (its tables):

- per option, each policy's record count per outcome (``success``, ``effect_fail``, ``explicit:<reason>``), and
  the (option, outcome) cells covered (at least one record) by each, by both, and of all the vocabulary's
  options x outcomes;
- the guards each synthesized (count and list, ``opt: literal & literal``), those in both, in one only;
- the cost: each run's seconds (episode loop, compile included, and without the compile: warm), records (=
  completed option executions) and records per second, and the LLM's cost relative to the uniform's per record
  (compile included and warm) and in wall time.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from jaxopt_marl.artifacts import BURNIN_JSON, ArtifactError, BurninSummary
from jaxopt_marl.records import read_records, vocab_from_table

COMPARE_JSON, COMPARE_MD = "compare.json", "compare.md"
#: The burn-in settings two runs must share to be compared (burnin.json keys).
MATCH_KEYS = ("game", "seed", "episodes", "solo_episodes", "joint_episodes", "steps", "min_support")
POLICIES = ("uniform", "llm")


class CompareError(ValueError):
    """Two burn-in runs that cannot be compared (the message names the file or the differing values)."""


def load_summary(d: str | Path) -> BurninSummary:
    """``d/burnin.json``; CompareError naming the file when it is missing or malformed."""
    path = Path(d) / BURNIN_JSON
    try:
        return BurninSummary.load(path)
    except FileNotFoundError:
        raise CompareError(f"{path} does not exist (not a burn-in directory: python -m experiments.burnin)") from None
    except ArtifactError as e:
        raise CompareError(str(e)) from None


def check_comparable(uniform: BurninSummary, llm: BurninSummary, dirs: tuple[str | Path, str | Path]) -> None:
    """CompareError unless the first run is ``uniform``, the second ``llm``, and every :data:`MATCH_KEYS` value is
    equal (the message names each differing key with both values)."""
    for s, want, d in zip((uniform, llm), POLICIES, dirs):
        if s.policy != want:
            raise CompareError(
                f"{Path(d) / BURNIN_JSON}: policy {s.policy!r}, expected {want!r} (--compare DIR_UNIFORM DIR_LLM)"
            )
    diff = [
        f"{k} {getattr(uniform, k)!r} vs {getattr(llm, k)!r}"
        for k in MATCH_KEYS
        if getattr(uniform, k) != getattr(llm, k)
    ]
    if diff:
        raise CompareError(f"cannot compare {dirs[0]} (uniform) with {dirs[1]} (llm): " + "; ".join(diff))


def guard_label(g: dict) -> str:
    """``"opt: feat=value & feat=value"`` (explicit guards: ``"opt: explicit NoPath"``) of a guards.jsonl line."""
    when = g["when"]
    if g.get("channel") == "explicit":
        return f"{g['opt']}: explicit {when.get('__reason__')}"
    return f"{g['opt']}: " + " & ".join(f"{k}={v}" for k, v in when.items())


def read_guard_labels(path: Path) -> list[str]:
    """The labels of a ``guards.jsonl`` in file order; CompareError naming the file and line if malformed."""
    if not path.exists():
        raise CompareError(f"{path} does not exist")
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(guard_label(json.loads(line)))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CompareError(f"{path}:{i}: not a guard line ({e})") from None
    return out


def outcome_counts(path: Path) -> tuple[dict[str, Counter], list[str], list[str]]:
    """``({option: Counter(outcome: records)}, option names, outcome names)`` of a ``records.parquet``; the names
    in the file's vocabulary order (outcomes: success, effect_fail, explicit:<reason> ...)."""
    if not Path(path).exists():
        raise CompareError(f"{path} does not exist (a burn-in directory has records.parquet)")
    try:
        table = read_records(path)
        vocab = vocab_from_table(table)
    except (OSError, ValueError) as e:
        raise CompareError(f"{path}: {e}") from None
    counts: dict[str, Counter] = {o: Counter() for o in vocab.option_names}
    for opt, out in zip(table.column("opt").to_pylist(), table.column("outcome").to_pylist()):
        counts[opt][out] += 1
    outcomes = ["success", "effect_fail"] + [f"explicit:{r}" for r in vocab.reason_names]
    return counts, list(vocab.option_names), outcomes


def compare(dir_uniform: str | Path, dir_llm: str | Path) -> dict:
    """The comparison of a uniform burn-in and a frozen-LLM one (module docstring).

    Raises:
        CompareError: a missing or malformed file, runs of other policies, or differing settings (named).
    """
    dirs = (Path(dir_uniform), Path(dir_llm))
    su, sl = load_summary(dirs[0]), load_summary(dirs[1])
    check_comparable(su, sl, dirs)
    cu, options, outcomes = outcome_counts(dirs[0] / "records.parquet")
    cl, options_l, _ = outcome_counts(dirs[1] / "records.parquet")
    if options_l != options:
        raise CompareError(f"the two record files have different option vocabularies: {options} vs {options_l}")
    gu, gl = read_guard_labels(dirs[0] / "guards.jsonl"), read_guard_labels(dirs[1] / "guards.jsonl")
    cells = {p: {(o, x) for o in options for x, n in c[o].items() if n > 0} for p, c in (("uniform", cu), ("llm", cl))}
    per_option = {
        o: {p: {x: c[o][x] for x in outcomes if c[o][x] > 0} for p, c in (("uniform", cu), ("llm", cl))}
        for o in options
    }
    runs = {}
    for p, s, d in (("uniform", su, dirs[0]), ("llm", sl, dirs[1])):
        runs[p] = dict(
            dir=str(d),
            model=s.model,
            temperature=s.temperature,
            decisions=s.decisions,
            seconds=s.seconds,
            decisions_per_s=s.decisions_per_s,
            seconds_compile=s.seconds_compile,
            seconds_warm=_warm(s),
            decisions_per_s_warm=None if _warm(s) is None else round(s.decisions / max(_warm(s), 1e-9), 1),
            guards=s.guards,
        )
    per_dec = lambda s: s.seconds / max(s.decisions, 1)
    warm = _warm(su) is not None and _warm(sl) is not None
    return dict(
        **{k: getattr(su, k) for k in MATCH_KEYS},
        runs=runs,
        outcomes=outcomes,
        per_option=per_option,
        cells_covered=dict(
            uniform=len(cells["uniform"]),
            llm=len(cells["llm"]),
            both=len(cells["uniform"] & cells["llm"]),
            only_uniform=sorted(f"{o} {x}" for o, x in cells["uniform"] - cells["llm"]),
            only_llm=sorted(f"{o} {x}" for o, x in cells["llm"] - cells["uniform"]),
            total=len(options) * len(outcomes),
        ),
        guards=dict(
            uniform=len(gu),
            llm=len(gl),
            uniform_list=gu,
            llm_list=gl,
            both=[g for g in gu if g in set(gl)],
            only_uniform=[g for g in gu if g not in set(gl)],
            only_llm=[g for g in gl if g not in set(gu)],
        ),
        cost=dict(
            seconds_ratio=round(sl.seconds / max(su.seconds, 1e-9), 2),
            seconds_per_decision_ratio=round(per_dec(sl) / max(per_dec(su), 1e-12), 2),
            warm_seconds_per_decision_ratio=(
                round((_warm(sl) / max(sl.decisions, 1)) / max(_warm(su) / max(su.decisions, 1), 1e-12), 2)
                if warm
                else None
            ),
            note="llm / uniform; seconds = the episode loop's wall time, compile included (warm: without the "
            "compile); decisions = records",
        ),
    )


def _warm(s: BurninSummary) -> float | None:
    """Seconds of the episode loop without the compile (None if the compile was not timed)."""
    return None if s.seconds_compile is None else round(max(s.seconds - s.seconds_compile, 0.0), 3)


def to_markdown(c: dict) -> str:
    """``compare.md``: the settings, the cost, the coverage per option and the guards of :func:`compare`'s dict."""
    u, ll = c["runs"]["uniform"], c["runs"]["llm"]
    lines = [
        f"# Burn-in: uniform vs frozen LLM ({c['game']}, paper §5.1)",
        "",
        f"seed {c['seed']}, {c['solo_episodes']} solo + {c['joint_episodes']} joint episodes of {c['steps']} steps, "
        f"min support {c['min_support']}; LLM: {ll['model']} at temperature {ll['temperature']}",
        "",
        "| | uniform | llm | llm / uniform |",
        "|---|---:|---:|---:|",
        f"| seconds (compile included) | {u['seconds']} | {ll['seconds']} | {c['cost']['seconds_ratio']} |",
        f"| of which compile | {u['seconds_compile']} | {ll['seconds_compile']} | |",
        f"| decisions (records) | {u['decisions']} | {ll['decisions']} | |",
        f"| decisions / s | {u['decisions_per_s']} | {ll['decisions_per_s']} | "
        f"{c['cost']['seconds_per_decision_ratio']} (s per decision) |",
        f"| decisions / s, warm | {u['decisions_per_s_warm']} | {ll['decisions_per_s_warm']} | "
        f"{c['cost']['warm_seconds_per_decision_ratio']} (s per decision) |",
        f"| option x outcome cells covered (of {c['cells_covered']['total']}) | {c['cells_covered']['uniform']} | "
        f"{c['cells_covered']['llm']} | both {c['cells_covered']['both']} |",
        f"| guards | {c['guards']['uniform']} | {c['guards']['llm']} | both {len(c['guards']['both'])} |",
        "",
        "## Records per option and outcome (uniform / llm)",
        "",
        "| option | " + " | ".join(c["outcomes"]) + " |",
        "|---|" + "---:|" * len(c["outcomes"]),
    ]
    for o, d in c["per_option"].items():
        cells = [f"{d['uniform'].get(x, 0)} / {d['llm'].get(x, 0)}" for x in c["outcomes"]]
        lines.append(f"| {o} | " + " | ".join(cells) + " |")
    lines += ["", "## Guards", ""]
    for name, key in (("both", "both"), ("uniform only", "only_uniform"), ("llm only", "only_llm")):
        gs = c["guards"][key]
        lines.append(f"- {name} ({len(gs)}): " + ("; ".join(f"`{g}`" for g in gs) if gs else "none"))
    return "\n".join(lines) + "\n"


def write_compare(dir_uniform: str | Path, dir_llm: str | Path, out: str | Path) -> dict:
    """Writes ``out/compare.json`` and ``out/compare.md``; returns the comparison (:func:`compare`)."""
    c = compare(dir_uniform, dir_llm)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / COMPARE_JSON).write_text(json.dumps(c, indent=2) + "\n")
    (out / COMPARE_MD).write_text(to_markdown(c))
    return c


__all__ = [
    "COMPARE_JSON",
    "COMPARE_MD",
    "MATCH_KEYS",
    "CompareError",
    "check_comparable",
    "compare",
    "guard_label",
    "outcome_counts",
    "to_markdown",
    "write_compare",
]
