"""Session fixtures shared by test modules: the tiny-model smoke runs of the games (each played once per test
session, as a subprocess of ``python -m experiments.<game> --preset smoke --model tiny-random``)."""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The runs' persistent JAX compilation cache (jaxopt_marl.pipeline.run): one fresh directory per test process, so
# the tests never write the repository's runs/.jax_cache, start cold like CI, and two test processes never share
# one. A directory the user set is kept.
if "JAXOPT_MARL_JAX_CACHE" not in os.environ:
    os.environ["JAXOPT_MARL_JAX_CACHE"] = tempfile.mkdtemp(prefix="jaxopt-marl-test-cache-")
    atexit.register(shutil.rmtree, os.environ["JAXOPT_MARL_JAX_CACHE"], ignore_errors=True)
#: game -> the command line's module and flags. Cleanup's run scores in ``choice_only`` mode (the cpu preset's),
#: the others sample (the smoke preset's), so both kinds of decision trace are covered.
SMOKE_COMMANDS = {
    "cleanup": ("experiments.cleanup", "--mode", "choice_only"),
    "harvest": ("experiments.harvest",),
    "overcooked_aa": ("experiments.overcooked", "--layout", "aa"),
    "overcooked_fc": ("experiments.overcooked", "--layout", "fc"),
}


def run_cli(*args, timeout=900):
    """``python -m <args>`` from the repository root; the CompletedProcess (text stdout and stderr)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="session")
def smoke_runs(tmp_path_factory):
    """``get(game) -> (run_dir, stdout)``: the smoke run of ``game`` (a key of :data:`SMOKE_COMMANDS`), played
    on first use and shared by every test of the session."""
    cache = {}

    def get(game):
        if game not in cache:
            out = tmp_path_factory.mktemp(f"smoke-{game}") / "run"
            p = run_cli(*SMOKE_COMMANDS[game], "--preset", "smoke", "--model", "tiny-random", "--out", str(out))
            assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
            cache[game] = (out, p.stdout)
        return cache[game]

    return get


@pytest.fixture(scope="session")
def smoke_run(smoke_runs):
    """The Overcooked Asymmetric Advantages smoke run: ``(run_dir, stdout)``."""
    return smoke_runs("overcooked_aa")
