"""The report built from the files of real tiny-model smoke runs (tests/conftest.py ``smoke_runs``: Cleanup in
``choice_only`` mode, Harvest and Overcooked AA sampling): the sections the audits promise (issue 13) and a report
that never overstates (issue 14), each figure checked against the run's own files."""

import json
import re
import shutil

import numpy as np
import pytest

from jaxopt_marl import artifacts, audit, report

GAMES = ("cleanup", "harvest", "overcooked_aa")


@pytest.fixture(scope="module")
def built(smoke_runs, tmp_path_factory, request):
    """game -> (run_dir copy, report text, captured figures {name: matplotlib Figure})."""
    cache = {}

    def get(game):
        if game not in cache:
            src, _ = smoke_runs(game)
            run = tmp_path_factory.mktemp(f"report-{game}") / "run"
            shutil.copytree(src, run)
            (run / "report.md").unlink()
            figs = {}
            save = report._save

            def capture(fig, run_dir, name):
                figs[name] = fig
                return save(fig, run_dir, name)

            mp = pytest.MonkeyPatch()
            mp.setattr(report, "_save", capture)
            try:
                md = report.write_report(run).read_text()
            finally:
                mp.undo()
            cache[game] = (run, md, figs)
        return cache[game]

    return get


def _section(md, title):
    start = md.index(title)
    nxt = [i for i in (md.find("\n## ", start + 1), md.find("\n### ", start + 1)) if i > 0]
    return md[start : min(nxt) if nxt else len(md)]


@pytest.mark.parametrize("game", GAMES)
def test_report_has_the_audit_sections(built, game):
    run, md, _ = built(game)
    traj = artifacts.EvalTrajectories.load(run / "eval_traj.npz")
    assert "## Missing inputs" in md and "None: every input file was found." in md
    # option histogram and role split
    assert "### Option choices and role split" in md and "![option histogram](figures/option_histogram.png)" in md
    assert "Role split (option names mapped to categories" in md and "- Roles: " in md
    # waiting fraction, by hand: in-play steps running an idle option over in-play steps
    p = traj.trained
    idle = [k for k, nm in enumerate(traj.option_names) if nm == "wait"]
    assert traj.idle_option_ids == idle and idle
    wf = (np.isin(p.options, idle) & p.alive).sum(axis=(0, 1)) / p.alive.sum(axis=(0, 1))
    table = _section(md, "### Trajectories")
    assert "waiting fraction (idle options)" in table
    rows = [r for r in table.splitlines() if re.match(r"\| a\d+ \|", r)]
    assert len(rows) == p.shape[2]
    for i, row in enumerate(rows):
        assert row.split(" | ")[-2] == f"{wf[i]:.3f}", row
    # solo test
    assert "### Solo test" in md and "Rule (`jaxopt_marl.audit.solo_verdict`)" in md
    # the map travels in the trajectories: walls from the env's map, drawn under the visits
    assert traj.walls.any() and traj.terrain.shape == traj.walls.shape
    assert (game == "harvest") == (traj.patch_id is not None)
    if game == "harvest":
        sec = _section(md, "### Harvest patch survival")
        assert "from the live-apple grids over time in `eval_traj.npz`" in sec
        assert "![patch survival](figures/patch_survival.png)" in sec
        # the replayed apple grids agree with the run's own final count (eval.json final_patches_alive)
        final = audit.patches_alive(p.apples[:, -1], traj.patch_id).sum(-1)
        ev = artifacts.EvalRecord.load(run / "eval.json")
        assert final.tolist() == [int(x) for x in ev.trained.metric("final_patches_alive")]
        assert f"): {report.fmt_pm(*audit.mean_std(final)[:2])} over 2 episode(s)." in sec
    else:
        assert "### Harvest patch survival" not in md
    if game.startswith("overcooked"):
        sec = _section(md, "### Hand-offs over counters")
        assert "| dropped by \\ picked by | a0 | a1 |" in sec and "hand-off(s) over 2 episode(s)" in sec
    else:
        assert "### Hand-offs" not in md


@pytest.mark.parametrize("game", ("cleanup", "harvest"))
def test_per_agent_apples_are_apples(built, game):
    run, md, _ = built(game)
    traj = artifacts.EvalTrajectories.load(run / "eval_traj.npz")
    ev = artifacts.EvalRecord.load(run / "eval.json")
    by_hand = traj.trained.rewards.astype(np.float64).sum(axis=1)  # [E, N] apples: a step's reward counts them
    apples = np.array([ep["agent_apples"] for ep in ev.trained.episodes], np.float64)
    np.testing.assert_array_equal(apples, by_hand)
    np.testing.assert_array_equal(apples.sum(axis=1), ev.trained.team_returns)  # they add up to the team return
    assert "The per-agent apples add up to the team return in all 2 episode(s)" in md
    sec = _section(md, "## Evaluation")
    for i in range(apples.shape[1]):
        m, sd = apples[:, i].mean(), apples[:, i].std(ddof=1)
        assert f"| a{i} | {m:.2f} ± {sd:.2f} |" in sec


def _lowest(ax):
    """The lowest y value drawn by the axes' collections: dots (offsets), bands (polygon vertices), whiskers
    (segments)."""
    from matplotlib.collections import LineCollection, PathCollection

    ys = []
    for coll in ax.collections:
        if isinstance(coll, PathCollection):
            ys += list(np.asarray(coll.get_offsets())[:, 1])
        elif isinstance(coll, LineCollection):
            ys += [y for seg in coll.get_segments() for y in np.asarray(seg)[:, 1]]
        else:
            ys += [y for path in coll.get_paths() for y in path.vertices[:, 1]]
    return min(ys)


@pytest.mark.parametrize("game", GAMES)
def test_report_never_overstates(built, game):
    run, md, figs = built(game)
    ev = json.loads((run / "eval.json").read_text())
    cfg = json.loads((run / "config.json").read_text())
    # Solo test: 1 seed (smoke preset) is below the rule's 3 scoring seeds: not informative, never evidence.
    solo = _section(md, "### Solo test")
    assert cfg["solo_episodes"] == 1 and "Not informative: the full team scored on" in solo
    assert "of the 1 seed(s), fewer than the 3 the rule needs" in solo
    assert "Needs a partner" not in solo and "evidence of coordination" not in solo
    # Trained vs base: both CIs and p of eval.json's statistics, and the noise verdict (2 vs 2 episodes).
    st = ev["stats"]
    t, b = st["trained"], st["base"]

    def ci(c):
        return f"[{c[0]:.2f}, {c[1]:.2f}]"

    row = (
        f"| team_return | {b['mean']:.2f} ± {b['std']:.2f} | {t['mean']:.2f} ± {t['std']:.2f} | 2 / 2 | "
        f"{ci(b['ci'])} | {ci(t['ci'])} | {st['mann_whitney']['p_value']:.3g} | not distinguishable from noise |"
    )
    assert row in md
    rows = [
        r
        for r in _section(md, "## Evaluation").splitlines()
        if r.startswith("| ") and " / " in r and not r.startswith("| metric")
    ]
    assert len(rows) > 3 and all(r.endswith("| not distinguishable from noise |") for r in rows)
    # Decision traces: choice_only responses are labelled templates; sampled ones model text.
    recs, bad = artifacts.load_traces(run / "decisions" / "eval.jsonl")
    assert bad == 0 and recs
    if cfg["mode"] == "choice_only":
        assert {r.response_source for r in recs} == {"template"}
        assert "**Templated responses.**" in md and f"the `response` of {len(recs)} of these {len(recs)}" in md
    else:
        assert {r.response_source for r in recs} == {"model"} and "Templated responses" not in md
        assert f"{len(recs)} trace(s) hold text the model generated" in md
    # The GIF is named: whose episode, which seed, how.
    assert (
        f"Whose episode: evaluation episode 0 (seed 10000) of the trained adapters of round "
        f"{ev['checkpoint_round']} ({ev['checkpoint_rule']}), replayed from its recorded primitive actions" in md
    )
    # Training table: rollout and update seconds from metrics.jsonl, to 0.1 s.
    for m in (json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()):
        assert f"| {m['perf/decisions_per_s']:.1f} | {m['perf/rollout_s']:.1f} | {m['perf/update_s']:.1f} |" in md
    assert "| round | team return | parse-fail rate | KL | decisions/s | rollout s | update s |" in md
    # Figures: integer round ticks, nothing below zero.
    ax = figs["training_curve.png"].axes[0]
    lo, hi = ax.get_xlim()
    ticks = [x for x in ax.get_xticks() if lo <= x <= hi]
    assert ticks and all(float(x).is_integer() for x in ticks)
    assert ax.get_ylim()[0] == 0
    assert _lowest(ax) >= 0 and len(ax.collections) == 2  # the min-max band and the rollout dots
    ax = figs["per_agent.png"].axes[0]
    assert ax.get_ylim()[0] == 0
    assert _lowest(ax) >= 0 and min(b.get_y() for b in ax.patches) >= 0  # whiskers, dots, bars
    # The heatmaps draw the map (walls, ...) under the visits.
    traj = artifacts.EvalTrajectories.load(run / "eval_traj.npz")
    hm = figs["visit_heatmaps.png"].axes[0]
    assert len(hm.images) == 2
    np.testing.assert_array_equal(hm.images[0].get_array(), traj.terrain)
    assert "wall" in figs["visit_heatmaps.png"].get_suptitle()


@pytest.mark.parametrize("game", ("cleanup", "overcooked_aa"))
def test_episode_gif_has_counter_caption_and_legend(smoke_runs, game):
    import imageio.v3 as iio

    run, _ = smoke_runs(game)
    frames = iio.imread(run / "episode.gif", index=None)
    cfg = json.loads((run / "config.json").read_text())
    assert frames.shape[0] == cfg["episode_steps"]
    # the step counter (first header line) changes from frame to frame; the legend at the bottom does not
    first, last = frames[0].astype(int), frames[-1].astype(int)
    assert np.abs(first[:15] - last[:15]).sum() > 0
    np.testing.assert_array_equal(first[-12:], last[-12:])


def test_annotate_frames_adds_counter_and_legend():
    from jaxopt_marl import episode_gif

    frames = np.zeros((2, 24, 30, 3), np.uint8)
    frames[1] = (200, 10, 10)
    out = episode_gif.annotate_frames(frames, [("wall", (10, 200, 30)), ("a0", (45, 110, 220))], "caption")
    assert out.shape[0] == 2 and out.shape[2] == 320 and out.shape[1] > 24
    # the legend swatches are painted in the exact colours (a 9 x 9 fill inside a 1-px outline)
    for rgb in ((10, 200, 30), (45, 110, 220)):  # colours no grey text pixel can take
        assert (out[0] == rgb).all(axis=-1).sum() == 81
    # the map is pasted unchanged: 24 x 30 pixels of its colour
    assert (out[1] == (200, 10, 10)).all(axis=-1).sum() == 24 * 30
    # the first header line is the step counter: it differs between frames; the caption line below does not
    assert not np.array_equal(out[0, :15], out[1, :15])
    np.testing.assert_array_equal(out[0, 15:30], out[1, 15:30])
    with pytest.raises(ValueError, match="uint8"):
        episode_gif.annotate_frames(frames.astype(np.float32), [], "x")
