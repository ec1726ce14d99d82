"""jaxopt_marl.config: each hyper-parameter declared once and validated there (a ValueError naming the field and
the value); the command line's new flags (recorded in config.json); --resume and --force against them."""

import json

import pytest

from experiments import common
from experiments.cli import INPUT_ERROR_STATUS
from jaxopt_marl import config, magrpo, pipeline, preflight
from lora.config import ALPHA_PER_RANK, LoRAConfig

PROG = "python -m experiments.overcooked"


@pytest.mark.parametrize(
    "field, bad",
    [
        ("temperature", 0.0),  # T = 0: the update's log-probs would be -inf
        ("temperature", -0.5),
        ("temperature", float("nan")),
        ("lora_rank", 0),
        ("lora_alpha", -1.0),
        ("learning_rate", 0.0),
        ("learning_rate", -1e-3),
        ("kl_beta", -0.1),
        ("num_rollouts", 0),
        ("epochs", 0),
        ("clip_eps", 1.5),
        ("min_support", 0),
        ("rounds", -1),  # 0 is a frozen-base evaluation (RunConfig.frozen)
        ("episode_steps", -3),
        ("eval_episodes", 0),
        ("burnin_episodes", 0),
        ("burnin_steps", 0),
        ("max_new_tokens", 0),
        ("seed", -1),
        ("solo_episodes", 25),
        ("micro_batch", -1),
        ("max_grad_norm", float("inf")),
    ],
)
def test_each_bad_value_names_its_field_and_value(field, bad):
    for make in (config.RunConfig.paper, config.RunConfig.smoke):
        with pytest.raises(ValueError) as e:
            make("overcooked_aa", **{field: bad})
        msg = str(e.value)
        assert msg.startswith(f"{field} must be "), msg
        assert msg.endswith(f"got {bad!r}") or f"got {bad!r} " in msg, msg


def test_unknown_names_are_value_errors():
    for kw, message in (
        ({"mode": "beam"}, "unknown scoring mode 'beam'"),
        ({"chunking": "x"}, "unknown chunking 'x'"),
        ({"letters": "sorted"}, "unknown letter order 'sorted'; valid: shuffled, fixed"),
        ({"letters": "fixed", "interface": "native"}, "letters 'fixed' is a menu-interface option; interface 'native'"),
        ({"eval_checkpoint": "last"}, "unknown eval checkpoint 'last'"),
        ({"no_such_field": 1}, "unknown RunConfig field(s): no_such_field"),
    ):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            config.RunConfig.paper("cleanup", **kw)
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        config.RunConfig.from_preset("huge", "cleanup")
    # The update's own config refuses T = 0 too (its log-probs divide by T).
    with pytest.raises(ValueError, match="temperature must be > 0, got 0"):
        magrpo.MAGRPOConfig(temperature=0)


def test_lora_config_is_one_field_with_alpha_declared_once():
    p = config.RunConfig.paper("cleanup")
    assert p.lora == LoRAConfig(num_adapters=7, rank=32, alpha=ALPHA_PER_RANK * 32) and p.lora_rank == 32
    o = config.RunConfig.paper("overcooked_fc")
    assert (o.lora.num_adapters, o.lora.rank, o.lora.alpha) == (2, 16, 32.0)
    r = p.replace(lora_rank=4)
    assert (r.lora.rank, r.lora.alpha) == (4, 8.0)  # a new rank: alpha follows
    assert p.replace(lora_rank=4, lora_alpha=1.0).lora.alpha == 1.0
    assert p.replace(shared_adapter=True).lora.num_adapters == 1  # Ablation B: one adapter
    assert LoRAConfig.paper(7) == p.lora and LoRAConfig.for_rank(2, 16) == o.lora
    flat = config.RunConfig.smoke("overcooked_aa").flat_dict()
    assert (flat["lora_rank"], flat["lora_alpha"], flat["min_support"]) == (2, 4.0, 5) and "lora" not in flat
    with pytest.raises(ValueError, match=r"lora.num_adapters must be 7 .*got 2"):
        config.RunConfig(game="cleanup", preset="paper", lora=LoRAConfig(num_adapters=2, rank=4))


def test_policy_and_update_read_one_temperature():
    cfg = config.RunConfig.paper("overcooked_aa", temperature=1.3)
    assert cfg.magrpo.temperature == cfg.policy_config().temperature == 1.3
    assert cfg.policy_config().mode == cfg.mode and cfg.policy_config().max_new_tokens == cfg.max_new_tokens
    assert magrpo.MAGRPOConfig.paper("overcooked_fc").temperature == config.PAPER["overcooked_fc"]["temperature"]


NEW_FLAGS = [
    "--lora-rank",
    "3",
    "--temperature",
    "1.25",
    "--learning-rate",
    "0.002",
    "--kl-beta",
    "0.2",
    "--num-rollouts",
    "3",
    "--min-support",
    "7",
]


def test_new_flags_land_in_config_json(tmp_path, monkeypatch):
    # The whole command line, stopped right after config.json (before the burn-in's compute).
    from jaxopt_marl import burnin

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(burnin, "run_burnin", stop)
    out = tmp_path / "run"
    with pytest.raises(Stop):
        common.main(None, ["--layout", "aa", "--preset", "smoke", "--out", str(out), *NEW_FLAGS])
    c = json.loads((out / "config.json").read_text())
    got = tuple(c[k] for k in ("lora_rank", "lora_alpha", "temperature", "learning_rate", "kl_beta"))
    assert got == (3, 6.0, 1.25, 0.002, 0.2)
    assert (c["num_rollouts"], c["min_support"]) == (3, 7)
    # --rollouts stays an alias of --num-rollouts.
    args = common.build_parser("x").parse_args(["--preset", "cpu", "--rollouts", "5"])
    assert common.config_from_args("harvest", args).magrpo.num_rollouts == 5


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--temperature", "0", "error: temperature must be > 0, got 0.0"),
        ("--lora-rank", "0", "error: lora_rank must be >= 1, got 0"),
        ("--learning-rate", "-1", "error: learning_rate must be a number > 0, got -1.0"),
        ("--kl-beta", "-0.5", "error: kl_beta must be a number >= 0, got -0.5"),
        ("--num-rollouts", "0", "error: num_rollouts must be >= 1, got 0"),
        ("--min-support", "0", "error: min_support must be >= 1, got 0"),
        ("--temperature", "warm", "error: argument --temperature: invalid float value: 'warm'"),
    ],
)
def test_bad_new_flags_fail_in_one_line_before_any_compute(flag, value, message, tmp_path, capfd):
    out = tmp_path / "never"
    capfd.readouterr()
    with pytest.raises(SystemExit) as e:
        common.cli(None, PROG, ["--layout", "aa", "--preset", "smoke", "--out", str(out), flag, value])
    err = capfd.readouterr().err.splitlines()
    assert e.value.code == INPUT_ERROR_STATUS
    assert len(err) == 1 and err[0].startswith(message), err
    assert not out.exists()


def _old_run(tmp_path, cfg):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    pipeline.write_config(cfg, run)
    return run


def test_resume_with_another_lora_rank_names_it_before_loading_anything(tmp_path, capfd, monkeypatch):
    from jaxopt_marl import rollout

    def never(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(rollout, "load_policy_model", never)
    run = _old_run(tmp_path, config.RunConfig.smoke("overcooked_aa"))
    before = sorted(p.name for p in run.rglob("*"))
    capfd.readouterr()
    with pytest.raises(SystemExit) as e:
        common.cli(
            None, PROG, ["--layout", "aa", "--preset", "smoke", "--out", str(run), "--resume", "--lora-rank", "4"]
        )
    err = capfd.readouterr().err.splitlines()
    assert e.value.code == INPUT_ERROR_STATUS and len(err) == 1, err
    assert err[0].startswith("error: --resume: the flags differ") and "in 2 key(s)" in err[0]
    assert "lora_rank: 2 in config.json, 4 given" in err[0] and "lora_alpha: 4.0 in config.json, 8.0 given" in err[0]
    assert sorted(p.name for p in run.rglob("*")) == before  # nothing written


def test_checkpoint_of_another_rank_says_so_not_corrupt(tmp_path):
    # A config.json from before the LoRA keys (so it cannot tell) and a checkpoint whose meta holds rank 4.
    cfg = config.RunConfig.smoke("overcooked_aa")
    run = _old_run(tmp_path, cfg)
    c = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({k: v for k, v in c.items() if not k.startswith("lora_")}))
    step = run / "checkpoints" / "1"
    for d in ("adapters", "opt_state", "meta"):
        (step / d).mkdir(parents=True)
    lora = config.lora_dict(cfg.replace(lora_rank=4).lora)
    (step / "meta" / "metadata").write_text(json.dumps({"round": 1, "step": 1, "lora": lora}))
    with pytest.raises(SystemExit, match=r"holds adapters of other LoRA settings \(lora_rank: 4 in the checkpoint, 2 "):
        preflight.prepare_run_dir(cfg, run, resume=True, force=False)
    assert preflight.check_checkpoint(run, cfg=cfg.replace(lora_rank=4)) == 1  # the same rank: intact


def test_force_with_a_bad_input_leaves_the_old_run_intact(tmp_path, capfd, monkeypatch):
    # A prompt over its limit is found after the model is loaded: --force must not have deleted the old run yet.
    from jaxopt_marl import prompt_ids

    def too_long(*a, **k):
        raise ValueError("overcooked_aa: the prompt needs 999 tokens, over the limit of 10")

    monkeypatch.setattr(prompt_ids, "PromptIds", too_long)
    run = _old_run(tmp_path, config.RunConfig.smoke("overcooked_aa"))
    (run / "eval.json").write_text("{}")
    before = sorted(p.name for p in run.rglob("*"))
    capfd.readouterr()
    with pytest.raises(SystemExit) as e:
        common.cli(None, PROG, ["--layout", "aa", "--preset", "smoke", "--out", str(run), "--force"])
    err = capfd.readouterr().err.splitlines()
    assert e.value.code == INPUT_ERROR_STATUS and err[-1].startswith("error: overcooked_aa: the prompt needs 999")
    assert sorted(p.name for p in run.rglob("*")) == before


def test_letter_order_reaches_the_rollouts():
    """``letters`` (config.json key) becomes the rollouts' PolicyConfig.shuffle_letters: shuffled by default
    (paper §5.1), in construction order with "fixed"."""
    assert config.RunConfig.paper("cleanup").policy_config().shuffle_letters is True
    fixed = config.RunConfig.smoke("cleanup", letters="fixed")
    assert fixed.policy_config().shuffle_letters is False and fixed.flat_dict()["letters"] == "fixed"
