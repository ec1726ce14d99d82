"""Session fixtures shared by test modules: the tiny-model smoke runs of the games (each played once per test
session, as a subprocess of ``python -m experiments.<game> --preset smoke --model tiny-random``).

The smoke runs a session needs are started in the background as soon as the tests are collected, one at a time,
so they overlap with the in-process tests (XLA compiles on one core; CI has two): a test that asks for a run
waits for it. A run nothing selected asks for is never played.
"""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The runs' persistent JAX compilation cache (experiments.common.run): one fresh directory per test process, so
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


def _smoke_argv(game, out):
    return [*SMOKE_COMMANDS[game], "--preset", "smoke", "--model", "tiny-random", "--out", str(out)]


class _SmokeRuns:
    """The session's smoke runs: a queue of games played one at a time by a background thread, each a
    subprocess (:func:`run_cli`'s command) into a fresh directory; :meth:`get` waits for a game's run."""

    def __init__(self):
        self.base = Path(tempfile.mkdtemp(prefix="jaxopt-marl-smoke-"))
        atexit.register(shutil.rmtree, self.base, ignore_errors=True)
        atexit.register(self._stop)
        self.cond = threading.Condition()
        self.queue, self.done, self.proc, self.thread = [], {}, None, None

    def start(self, games):
        """Queue ``games`` (in order) and start the background player."""
        with self.cond:
            self.queue += [g for g in games if g not in self.queue and g not in self.done]
            if self.thread is None and self.queue:
                self.thread = threading.Thread(target=self._player, name="smoke-runs", daemon=True)
                self.thread.start()

    def _player(self):
        while True:
            with self.cond:
                if not self.queue:
                    self.thread = None
                    return
                game = self.queue.pop(0)
            out = self.base / f"smoke-{game}" / "run"
            out.parent.mkdir(parents=True)
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            try:
                with self.cond:
                    self.proc = subprocess.Popen(
                        [sys.executable, "-m", *_smoke_argv(game, out)],
                        cwd=ROOT,
                        env=env,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                stdout, stderr = self.proc.communicate(timeout=900)
                result = (out, self.proc.returncode, stdout, stderr)
            except Exception as e:  # reported by get()
                if self.proc is not None:
                    self.proc.kill()
                result = (out, None, "", repr(e))
            with self.cond:
                self.proc = None
                self.done[game] = result
                self.cond.notify_all()

    def _stop(self):
        with self.cond:
            self.queue.clear()
            if self.proc is not None:
                self.proc.kill()

    def get(self, game):
        """``(run_dir, stdout)`` of ``game``'s smoke run; queued first (ahead of the others) if not yet asked."""
        with self.cond:
            if game not in self.done:
                if game in self.queue:
                    self.queue.remove(game)
                self.queue.insert(0, game)
        self.start([])
        with self.cond:
            self.cond.wait_for(lambda: game in self.done)
            out, rc, stdout, stderr = self.done[game]
        assert rc == 0, f"{_smoke_argv(game, out)}: exit status {rc}\n" + stdout[-3000:] + stderr[-3000:]
        return out, stdout


_SMOKE = _SmokeRuns()


def pytest_collection_modifyitems(session, config, items):
    """Start the smoke runs the selected tests will ask for, in the order they first ask (``smoke_run``:
    Overcooked AA; ``smoke_runs``: the test's ``game`` parameter, else every game). Not under pytest-xdist,
    whose workers each collect every test but run only some (there the runs start on first use), nor for
    ``--collect-only``."""
    if os.environ.get("PYTEST_XDIST_WORKER") or config.option.collectonly:
        return
    games = []
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "smoke_run" in names:
            games.append("overcooked_aa")
        elif "smoke_runs" in names:
            callspec = getattr(item, "callspec", None)
            game = callspec.params.get("game") if callspec else None
            games += [game] if game in SMOKE_COMMANDS else list(SMOKE_COMMANDS)
    _SMOKE.start(list(dict.fromkeys(games)))


@pytest.fixture(scope="session")
def smoke_runs():
    """``get(game) -> (run_dir, stdout)``: the smoke run of ``game`` (a key of :data:`SMOKE_COMMANDS`), played
    once per session (in the background from the start, see the module docstring) and shared by every test."""
    return _SMOKE.get


@pytest.fixture(scope="session")
def smoke_run(smoke_runs):
    """The Overcooked Asymmetric Advantages smoke run: ``(run_dir, stdout)``."""
    return smoke_runs("overcooked_aa")
