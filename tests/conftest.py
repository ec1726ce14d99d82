"""Session fixtures shared by test modules: the tiny-model smoke runs of the games (each played once per test
session, as a subprocess of ``python -m experiments.<game> --preset smoke --model tiny-random``).

The smoke runs (and other subprocess jobs, tests/background.py) a session needs start in the background as soon
as the tests are collected, one at a time, so they overlap with the in-process tests (XLA compiles on one core;
CI has two): a test that asks for a job's result waits for it. A job no selected test asks for never runs.
"""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Compiles are most of the suite's time (a compiled rollout: 25-35 s of XLA per configuration on CI's CPU), and
# the tests' programs are small, so the tests (and, through the environment, their subprocess jobs) compile with
# JAX's own low-optimisation switch: LLVM optimisation level 0, no expensive LLVM passes (jax._src.compiler).
# About 30% less compile time (tests/test_compiled_rollout.py::test_chunking_does_not_change_decisions: 97 s ->
# 69 s). Every assertion holds either way: the exact ones compare a program with itself or integer results, the
# float ones are bounded by float32 error (tests/helpers.py), not by one compiler's rounding. A user's setting
# (JAX_DISABLE_MOST_OPTIMIZATIONS=0) is kept.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

import jax  # noqa: E402  (after the environment above, which JAX reads at import)
import pytest  # noqa: E402

from tests.background import BACKGROUND  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# The runs' persistent JAX compilation cache (jaxopt_marl.pipeline.run): one fresh directory per test process, so
# the tests never write the repository's runs/.jax_cache, start cold like CI, and two test processes never share
# one. A directory the user set is kept.
# (An xdist worker inherits its controller's directory, marked by _OWN_CACHE, and makes its own.)
_OWN_CACHE = "JAXOPT_MARL_TEST_OWN_JAX_CACHE"
if "JAXOPT_MARL_JAX_CACHE" not in os.environ or os.environ.get(_OWN_CACHE):
    os.environ["JAXOPT_MARL_JAX_CACHE"] = tempfile.mkdtemp(prefix="jaxopt-marl-test-cache-")
    os.environ[_OWN_CACHE] = "1"
    atexit.register(shutil.rmtree, os.environ["JAXOPT_MARL_JAX_CACHE"], ignore_errors=True)
# The in-process tests' persistent compilation cache: a fresh directory of their own (not the runs'), so a program
# that several tests compile (the same computation traced again by another jit closure: a train step or a model
# call of the same configuration and shapes) compiles once per test process. A hit loads the executable the
# compile produced: results are bit-identical.
_INPROCESS_CACHE = tempfile.mkdtemp(prefix="jaxopt-marl-test-inprocess-cache-")
atexit.register(shutil.rmtree, _INPROCESS_CACHE, ignore_errors=True)
jax.config.update("jax_compilation_cache_dir", _INPROCESS_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
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


def _smoke_argv(game, out):
    return ["-m", *SMOKE_COMMANDS[game], "--preset", "smoke", "--model", "tiny-random", "--out", str(out)]


def _smoke_dir(game):
    return BACKGROUND.base / f"smoke-{game}" / "run"


for _game in SMOKE_COMMANDS:
    _smoke_dir(_game).parent.mkdir(parents=True, exist_ok=True)
    BACKGROUND.register(f"smoke:{_game}", _smoke_argv(_game, _smoke_dir(_game)))


def pytest_configure(config):
    config.addinivalue_line("markers", "background(name): the test reads background job ``name`` (tests/conftest.py)")


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: only the tests that will run start jobs
def pytest_collection_modifyitems(session, config, items):
    """Start the background jobs the selected tests will ask for, in the order they first ask (``smoke_run``:
    Overcooked AA's smoke run; ``smoke_runs``: the test's ``game`` parameter, else every game; the
    ``background`` marker's name). Under pytest-xdist every worker collects every test and queues every job, and
    the workers share them (tests/background.py: each job plays once, in the first process to take it). Not for
    ``--collect-only``."""
    if config.option.collectonly:
        return
    names = []
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec else {}
        if "smoke_run" in fixtures:
            names.append("smoke:overcooked_aa")
        elif "smoke_runs" in fixtures:
            game = params.get("game")
            names += [f"smoke:{g}" for g in ([game] if game in SMOKE_COMMANDS else SMOKE_COMMANDS)]
        for mark in item.iter_markers("background"):
            names.append(mark.args[0].format(**params))
    BACKGROUND.start(names)


def pytest_terminal_summary(terminalreporter):
    """The background jobs' wall times, so a slow suite shows whether the jobs or the in-process tests bound it."""
    if BACKGROUND.seconds:
        terminalreporter.write_sep("-", f"background jobs: {sum(BACKGROUND.seconds.values()):.0f} s in all")
        for name, secs in BACKGROUND.seconds.items():
            terminalreporter.write_line(f"{secs:8.1f}s  {name}")


@pytest.fixture(scope="session")
def smoke_runs():
    """``get(game) -> (run_dir, stdout)``: the smoke run of ``game`` (a key of :data:`SMOKE_COMMANDS`), played
    once per session (in the background from the start, tests/background.py) and shared by every test."""

    def get(game):
        p = BACKGROUND.get(f"smoke:{game}")
        assert p.returncode == 0, f"{p.args}: exit status {p.returncode}\n" + p.stdout[-3000:] + p.stderr[-3000:]
        return _smoke_dir(game), p.stdout

    return get


@pytest.fixture(scope="session")
def smoke_run(smoke_runs):
    """The Overcooked Asymmetric Advantages smoke run: ``(run_dir, stdout)``."""
    return smoke_runs("overcooked_aa")
