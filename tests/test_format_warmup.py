"""The optional format warm-up (jaxopt_marl.format_warmup): the merge of an adapter into the frozen kernels, the
target answers, the examples taken from a compiled call, the env seeds, learning on the tiny model, the saved
warm-up merged again on resume, the pipeline end to end, and bad input."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments import common, crossplay, seeds
from jaxopt_marl import config, evaluation, format_warmup, menus, parsing, prompts, rollout, seeding, trainer
from jaxopt_marl.errors import InputError
from lora import LoRAConfig, ModelConfig, split_model
from lora import checkpoint as ckpt
from lora.model import Decoder, LoRALinear
from lora.tokenizer import end_of_turn_id, stop_token_ids
from tests.conftest import run_cli
from tests.helpers import assert_fp32_close, tiny_compiled_roller


def _random_b(model, key):
    """Every adapter's B drawn at N(0, 0.05^2) (B starts at 0: the merge would add nothing)."""
    for m in format_warmup.lora_projections(model):
        key, sub = jax.random.split(key)
        m.lora_b.value = 0.05 * jax.random.normal(sub, m.lora_b[...].shape, jnp.float32)


def test_merge_of_one_projection_is_w_plus_scaled_ab():
    """A hand-sized projection: W + (alpha / rank) A_i B_i exactly (small integers and a power-of-two scaling)."""
    lin = LoRALinear(
        2, 3, use_bias=False, lora=LoRAConfig(num_adapters=2, rank=1, alpha=2.0), dtype=jnp.float32, rngs=nnx.Rngs(0)
    )
    lin.kernel.value = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    lin.lora_a.value = jnp.array([[[9.0], [9.0]], [[1.0], [-2.0]]])  # [N=2, in=2, r=1]
    lin.lora_b.value = jnp.array([[[9.0, 9.0, 9.0]], [[3.0, 0.0, -1.0]]])  # [N=2, r=1, out=3]

    class Holder(nnx.Module):
        def __init__(self, lin):
            self.lin = lin

    assert format_warmup.merge_adapter(Holder(lin), 1) == 1
    # scaling = alpha / rank = 2: W + 2 * [[1], [-2]] @ [[3, 0, -1]]
    np.testing.assert_array_equal(np.asarray(lin.kernel[...]), [[7.0, 2.0, 1.0], [-8.0, 5.0, 10.0]])
    with pytest.raises(ValueError, match="adapter index 2 out of range: the model has 2 adapters"):
        format_warmup.merge_adapter(Holder(lin), 2)


def test_merged_base_with_adapters_off_equals_the_adapter_on():
    """The stacked-layer decoder: logits of adapter 1 on the base == logits of the merged base, adapters off (one
    float32 program against another: the projection's two summation orders), and a zero adapter merges to the
    very same kernels."""
    cfg = ModelConfig.tiny()
    model = Decoder(cfg, LoRAConfig(num_adapters=2, rank=4, alpha=8.0), rngs=nnx.Rngs(0))
    ids = jax.random.randint(jax.random.key(1), (2, 9), 0, cfg.vocab_size)
    kernels0 = [np.asarray(m.kernel[...]) for m in format_warmup.lora_projections(model)]
    format_warmup.merge_adapter(model, 0)  # B = 0 at init: W + 0
    for k0, m in zip(kernels0, format_warmup.lora_projections(model)):
        np.testing.assert_array_equal(np.asarray(m.kernel[...]), k0)
    _random_b(model, jax.random.key(2))
    on = np.asarray(model(ids, agent_ids=jnp.ones(2, jnp.int32)))
    off_before = np.asarray(model(ids))
    format_warmup.merge_adapter(model, 1)
    off = np.asarray(model(ids))
    assert np.abs(on - off_before).max() > 1e-3  # the adapter changes the logits: the comparison can fail
    n = cfg.num_layers * (4 * cfg.hidden_size + 2 * cfg.intermediate_size + cfg.head_dim + 9) + 2 * cfg.hidden_size
    assert_fp32_close(off, on, n, k=2 * 8.0)


def test_answer_ids_parse_as_the_contract():
    """Each game's labels with letters A and C: the target decodes to the two-line answer, parses to that state
    and letter, and ends with SmolLM2's end of turn (``<|im_end|>``, also its EOS: the one stop token)."""
    tok = rollout.smollm2_tokenizer()
    end = end_of_turn_id(tok)
    assert tok.convert_ids_to_tokens(end) == "<|im_end|>" and stop_token_ids(tok) == (end,)
    letter_ids = [tok.encode(f" {c}", add_special_tokens=False)[0] for c in menus.LETTERS]
    for fam, labels in prompts.STATE_LABELS.items():
        for label in labels:
            for j in (0, 2):
                ids = format_warmup.answer_ids(tok, label, letter_ids[j], end)
                assert ids[-1] == end and ids[-2] == letter_ids[j]
                text = tok.decode(ids[:-1])
                assert text == f"state: {label}\nchoice: {menus.LETTERS[j]}", (fam, text)
                res = parsing.parse_response(text, "ABC")
                assert (res.reason, res.letter, res.state) == (parsing.OK, menus.LETTERS[j], label)


def test_warmup_seeds_are_disjoint_from_training_and_evaluation():
    k = 8
    seen = set()
    for seed in range(4):
        ws = format_warmup.warmup_seeds(seed, k)
        assert ws == [500_000 + 1000 * seed + i for i in range(k)]
        train = {s for r in range(200) for s in trainer.train_seeds(seed, r, k)}
        ev = set(range(config.EVAL_SEED0, config.EVAL_SEED0 + 20))
        assert not (set(ws) & train) and not (set(ws) & ev) and not (set(ws) & seen)
        seen |= set(ws)
    assert format_warmup.warmup_seeds(500, 2) == [500_000, 500_001]  # the modulus keeps them in range
    assert int(seeding.format_warmup_key(0)[1]) != int(evaluation.eval_key(config.RunConfig.smoke("cleanup"))[1])


@pytest.fixture(scope="module")
def played():
    """A frozen-base compiled call of the tiny model on Overcooked AA (2 episodes of 8 steps, sample mode)."""
    pcfg = rollout.PolicyConfig(mode="sample", temperature=1.0, max_new_tokens=6)
    roller = tiny_compiled_roller("overcooked_aa", 8, pcfg)
    res = roller.collect([500_000, 500_001], seeding.format_warmup_key(0), reference=True)
    return roller, res


def test_examples_are_the_traced_prompts(played):
    """Each example is the decision's prompt as the model saw it (the trace's ``prompt_ids``: system turn
    included), its menu size, and the state label code the trace's template would write."""
    roller, res = played
    ex = format_warmup.examples_from(res, roller.prefix_ids)
    assert len(ex) == len(res.traces) > 0
    for (ids, label, n), t in zip(ex, res.traces):
        assert ids == t["prompt_ids"] and n == t["n_letters"]
        assert 0 <= label < len(prompts.STATE_LABELS["overcooked"])


def test_training_lowers_the_loss_and_touches_adapter_0_only(played, monkeypatch):
    """30 steps at lr 1e-2 (the tiny random model learns nothing at the default 2e-4 in a test's budget): the last
    five losses average under the first less 1 nat; adapter 1 keeps its values bit for bit; the letters drawn
    cover the menus' letters only."""
    roller, res = played
    monkeypatch.setattr(format_warmup, "LEARNING_RATE", 1e-2)
    model = roller.model
    _, before, _ = split_model(model)
    before = jax.tree.map(np.asarray, before)
    ex = format_warmup.examples_from(res, roller.prefix_ids)
    counts, losses = format_warmup.train(
        model, roller.tok, "overcooked_aa", ex, roller.letter_ids, 30, 0, log=lambda s: None
    )
    _, after, _ = split_model(model)
    nnx.update(model, jax.tree.map(jnp.asarray, before))  # the module's other tests see the untrained model
    first, last5 = losses[0]["loss"], np.mean([r["loss"] for r in losses[-5:]])
    assert last5 < first - 1.0, (first, last5)
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(jax.tree.map(np.asarray, after))):
        np.testing.assert_array_equal(a[..., 1, :, :], b[..., 1, :, :])
    assert counts.sum() == 30 * format_warmup.BATCH_ROWS
    assert counts[max(n for _, _, n in ex) :].sum() == 0


def test_run_saves_a_warmup_that_apply_saved_merges_again(played, tmp_path):
    """:func:`format_warmup.run` leaves the adapters at their initial values and the kernels merged; a fresh
    model of the same seed with :func:`format_warmup.apply_saved` has the very same kernels and adapters."""
    roller, _ = played
    cfg = config.RunConfig.smoke("overcooked_aa", format_warmup=2, num_rollouts=2, lora_rank=2)
    _, init, base0 = split_model(roller.model)
    init, base0 = jax.tree.map(np.asarray, init), jax.tree.map(np.asarray, base0)
    summary = format_warmup.run(cfg, roller, roller.tok, tmp_path, log=lambda s: None)
    assert summary["steps"] == 2 and len(summary["losses"]) == 2 and summary["examples"] > 0
    assert json.loads((tmp_path / format_warmup.SUMMARY_FILE).read_text()) == summary
    _, ad, merged = split_model(roller.model)
    for a, b in zip(jax.tree.leaves(init), jax.tree.leaves(ad)):
        np.testing.assert_array_equal(a, np.asarray(b))
    changed = [not np.array_equal(a, np.asarray(b)) for a, b in zip(jax.tree.leaves(base0), jax.tree.leaves(merged))]
    assert sum(changed) == len(format_warmup.lora_projections(roller.model))  # the LoRA kernels, nothing else

    fresh, _ = rollout.load_policy_model(rollout.TINY_RANDOM, LoRAConfig(num_adapters=2, rank=2, alpha=4.0))
    format_warmup.apply_saved(fresh, tmp_path)
    _, ad2, base2 = split_model(fresh)
    for a, b in zip(jax.tree.leaves(merged), jax.tree.leaves(base2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(init), jax.tree.leaves(ad2)):
        np.testing.assert_array_equal(a, np.asarray(b))
    with pytest.raises(FileNotFoundError, match="no saved format warm-up"):
        format_warmup.apply_saved(fresh, tmp_path / "elsewhere")

    # --resume's checks: the saved warm-up passes; another step count (the summary's) and a damaged file are named
    format_warmup.check_resume(cfg, tmp_path)
    with pytest.raises(
        ValueError, match=r"records 2 steps and 2 losses, not the 3 steps asked: delete .*format_warmup.json"
    ):
        format_warmup.check_resume(cfg.replace(format_warmup=3), tmp_path)
    step = tmp_path / format_warmup.CHECKPOINT_DIR / "2"
    files = [f for f in step.rglob("*") if f.is_file() and f.name != ckpt.CHECKSUMS]
    victim = max(files, key=lambda f: f.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"damaged: {victim}"):
        format_warmup.check_resume(cfg, tmp_path)
    with pytest.raises(ValueError, match="the saved format warm-up is damaged"):
        format_warmup.apply_saved(fresh, tmp_path)

    # a save left by a run killed before its summary: the warm-up is redone and replaces it (orbax alone would
    # keep the damaged step 2 and skip the new save)
    nnx.update(roller.model, jax.tree.map(jnp.asarray, base0))
    (tmp_path / format_warmup.SUMMARY_FILE).unlink()
    format_warmup.run(cfg, roller, roller.tok, tmp_path, log=lambda s: None)
    again, _ = rollout.load_policy_model(rollout.TINY_RANDOM, LoRAConfig(num_adapters=2, rank=2, alpha=4.0))
    format_warmup.apply_saved(again, tmp_path)
    for a, b in zip(jax.tree.leaves(merged), jax.tree.leaves(split_model(again)[2])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    nnx.update(roller.model, jax.tree.map(jnp.asarray, base0))


def test_resume_without_a_summary_redoes_the_warmup_unless_it_is_new(tmp_path):
    """No summary: the warm-up is (re)done -- in a run that has trained, only if its config.json records this
    warm-up (then with a warning); a summary that is not whole is named."""
    from jaxopt_marl.pipeline import write_config

    cfg = config.RunConfig.smoke("overcooked_aa", format_warmup=2)
    said = []
    format_warmup.check_resume(cfg, tmp_path, log=said.append)  # nothing yet: the warm-up will run
    assert said == []
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    write_config(cfg.replace(format_warmup=0), tmp_path)
    with pytest.raises(ValueError, match=r"has metrics.jsonl from a run without this warm-up \(config.json: "):
        format_warmup.check_resume(cfg, tmp_path, log=said.append)
    format_warmup.check_resume(cfg.replace(format_warmup=0), tmp_path)  # no warm-up asked: nothing to check
    write_config(cfg, tmp_path)  # the run had this warm-up; its files were deleted: redone, said so
    format_warmup.check_resume(cfg, tmp_path, log=said.append)
    assert len(said) == 1 and "is missing in a run that has metrics.jsonl: the format warm-up is redone" in said[0]

    summary = tmp_path / format_warmup.SUMMARY_FILE
    for text, message in (
        ("{}", "is not a format warm-up summary"),
        ('{"steps": 2, "loss', "is unreadable"),
        ("[1, 2]", "is not a format warm-up summary"),
    ):
        summary.write_text(text)
        with pytest.raises(ValueError, match=f"{summary}.*{message}.*delete"):
            format_warmup.check_resume(cfg, tmp_path)
    whole = {"steps": 2, "examples": 5, "episodes": 2, "base_parse_fail_rate": 1.0}
    summary.write_text(json.dumps({**whole, "losses": [{"step": 1, "loss": 3.0}]}))
    with pytest.raises(ValueError, match="records 2 steps and 1 losses, not the 2 steps asked"):
        format_warmup.check_resume(cfg, tmp_path)
    summary.write_text(json.dumps({**whole, "losses": [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0}]}))
    with pytest.raises(ValueError, match=r"format_warmup is missing, but .* says the warm-up was saved"):
        format_warmup.check_resume(cfg, tmp_path)


def test_budget_must_hold_the_longest_answer():
    """SmolLM2's tokens: Overcooked's ``state: ready_to_plate\\nchoice: A`` is 11 before the end of turn, so the
    smoke preset's 8-token budget is refused naming 11, and 11 passes; Cleanup's 7 fit 8."""
    tok = rollout.smollm2_tokenizer()
    with pytest.raises(ValueError, match=r"'state: ready_to_plate\\nchoice: A', is 11 tokens .* over max_new_tokens 8"):
        format_warmup.check_budget(config.RunConfig.smoke("overcooked_aa", format_warmup=2), tok)
    format_warmup.check_budget(config.RunConfig.smoke("overcooked_aa", format_warmup=2, max_new_tokens=11), tok)
    format_warmup.check_budget(config.RunConfig.smoke("cleanup", format_warmup=2), tok)
    with pytest.raises(ValueError, match="is 7 tokens"):
        format_warmup.check_budget(config.RunConfig.smoke("cleanup", format_warmup=2, max_new_tokens=6), tok)


def test_pipeline_with_warmup_writes_it_and_resume_merges_it_again(tmp_path):
    """``--format-warmup 2`` end to end on the smoke preset: ``format_warmup.json`` and ``format_warmup/`` are
    written, the report says the base was warmed up, and ``--resume`` with one more round merges the saved
    warm-up instead of training it again."""
    out = tmp_path / "run"

    def argv(rounds):
        return [
            "experiments.overcooked",
            "--layout",
            "aa",
            "--preset",
            "smoke",
            "--model",
            "tiny-random",
            "--format-warmup",
            "2",
            "--max-new-tokens",
            "12",
            "--rounds",
            str(rounds),
            "--eval-episodes",
            "1",
            "--solo-episodes",
            "0",
            "--out",
            str(out),
        ]

    p = run_cli(*argv(1))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "format warm-up step 2/2" in p.stdout and "format warm-up (not the paper): 2 supervised steps" in p.stdout
    fw = json.loads((out / "format_warmup.json").read_text())
    assert [r["step"] for r in fw["losses"]] == [1, 2] and fw["env_seeds"] == [500_000, 500_001]
    assert sum(fw["base_parse_counts"].values()) == fw["examples"]
    assert json.loads((out / "config.json").read_text())["format_warmup"] == 2
    assert (
        "**Format warm-up (not the paper).** Before round 0, 2 supervised LoRA steps" in (out / "report.md").read_text()
    )
    p = run_cli(*argv(2), "--resume")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "merged the saved adapter" in p.stdout and "format warm-up step" not in p.stdout
    assert len(trainer.read_metrics(out / "metrics.jsonl")) == 2


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"format_warmup": -1}, r"format_warmup must be an integer in 0..10000"),
        ({"format_warmup": 10**20}, r"format_warmup must be an integer in 0..10000 .*, got 100000000000000000000"),
        ({"format_warmup": 2, "mode": "choice_only"}, "interface 'menu', mode 'sample'.*mode 'choice_only'"),
        ({"format_warmup": 2, "interface": "native"}, "got interface 'native'"),
    ],
)
def test_bad_warmup_settings_are_named(kw, message):
    with pytest.raises(ValueError, match=message):
        config.RunConfig.smoke("cleanup", **kw)


def test_cli_refuses_a_warmup_in_choice_only_mode_before_compute(tmp_path):
    with pytest.raises(SystemExit, match="format_warmup 3"):
        common.main(
            "cleanup",
            ["--preset", "smoke", "--mode", "choice_only", "--format-warmup", "3", "--out", str(tmp_path / "never")],
        )
    assert not (tmp_path / "never").exists()


def test_crossplay_refuses_warmed_up_runs(tmp_path):
    runs = []
    for i, w in enumerate((0, 3)):
        d = tmp_path / f"r{i}"
        d.mkdir()
        cfg = config.RunConfig.smoke("overcooked_aa", format_warmup=w)
        (d / "config.json").write_text(json.dumps(cfg.flat_dict()))
        runs.append(crossplay.Run(d, cfg.flat_dict(), cfg, {}))
    with pytest.raises(InputError, match=r"cannot be crossed: .*r1 \(3 steps\)"):
        crossplay.check_compatible(runs)


def test_cli_refuses_a_budget_under_the_answer_and_the_grid_refuses_the_flag(tmp_path):
    from experiments import table2

    with pytest.raises(SystemExit, match="give --max-new-tokens 11 or more"):
        common.main(None, ["--layout", "aa", "--preset", "smoke", "--format-warmup", "2", "--out", str(tmp_path / "a")])
    assert not (tmp_path / "a").exists()
    with pytest.raises(SystemExit, match="--format-warmup: the grid runs the paper's six cells"):
        table2.main(["--game", "cleanup", "--preset", "smoke", "--format-warmup", "2", "--out", str(tmp_path / "t")])


def test_seeds_summary_says_the_bases_were_warmed_up(tmp_path, capsys):
    """A seeds study of warmed-up runs (hand-built finished seed directories) says so in seeds.json and seeds.md."""
    from tests.test_seeds import _finished_seed

    argv = [
        "--game",
        "harvest",
        "--preset",
        "smoke",
        "--eval-episodes",
        "2",
        "--solo-episodes",
        "0",
        "--format-warmup",
        "2",
    ]
    ap = seeds.build_seeds_parser()
    out = tmp_path / "o"
    for s, rets in ((0, [1, 3]), (1, [2, 2])):
        _finished_seed(out, common.config_from_args("harvest", ap.parse_args([*argv, "--seed", str(s)])), rets)
    seeds.main([*argv, "--seeds", "2", "--out", str(out), "--resume"])
    assert json.loads((out / "seeds.json").read_text())["format_warmup"] == 2
    md = (out / "seeds.md").read_text()
    assert "**Format warm-up (not the paper).** Each seed's run merged 2 supervised steps" in md
