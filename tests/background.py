"""Subprocess jobs that tests read, played in the background from the start of the session (tests/conftest.py
queues those of the selected tests at collection), so they overlap with the in-process tests: XLA compiles on
one core, CI has two. One module (imported as ``tests.background`` by conftest and the tests alike) holds the
session's :data:`BACKGROUND`."""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class Background:
    """Subprocess jobs (``python <argv>`` from the repository root) played one at a time by a background thread,
    in the order queued; :meth:`get` waits for a job (queued first, ahead of the others, if not yet started).

    A job is a name and a ``(argv, env overrides)`` spec, registered by a test module at import (the smoke runs:
    tests/conftest.py). tests/conftest.py's ``pytest_collection_modifyitems`` queues the jobs of the selected
    tests: ``smoke_run`` / ``smoke_runs`` users and tests marked ``@pytest.mark.background(name)`` (``name``
    formatted with the test's parameters)."""

    def __init__(self):
        self.base = Path(tempfile.mkdtemp(prefix="jaxopt-marl-tests-"))
        atexit.register(shutil.rmtree, self.base, ignore_errors=True)
        atexit.register(self._stop)
        self.cond = threading.Condition()
        self.specs, self.queue, self.done = {}, [], {}
        self.seconds = {}  # name -> wall seconds the job ran (in the order they finished)
        self.running, self.proc, self.thread = None, None, None

    def register(self, name, argv, env=None):
        self.specs[name] = (list(argv), dict(env or {}))

    def _spec(self, name):
        if name not in self.specs:
            raise KeyError(f"no background job {name!r}; registered: {sorted(self.specs)}")
        return self.specs[name]

    def start(self, names):
        """Queue ``names`` (in order) and start the background player."""
        for name in names:
            self._spec(name)  # unknown names fail here, in the caller
        with self.cond:
            self.queue += [n for n in dict.fromkeys(names) if n not in self.queue and n not in self.done]
            if self.thread is None and self.queue:
                self.thread = threading.Thread(target=self._player, name="background-jobs", daemon=True)
                self.thread.start()

    def _player(self):
        while True:
            with self.cond:
                if not self.queue:
                    self.thread = None
                    return
                name = self.running = self.queue.pop(0)
                argv, extra = self.specs[name]
            env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)
            t0 = time.monotonic()
            try:
                with self.cond:
                    self.proc = subprocess.Popen(
                        [sys.executable, *argv],
                        cwd=ROOT,
                        env=env,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                stdout, stderr = self.proc.communicate(timeout=900)
                result = subprocess.CompletedProcess(argv, self.proc.returncode, stdout, stderr)
            except Exception as e:  # reported by the test that asks
                if self.proc is not None:
                    self.proc.kill()
                result = subprocess.CompletedProcess(argv, None, "", repr(e))
            with self.cond:
                self.proc = self.running = None
                self.done[name] = result
                self.seconds[name] = time.monotonic() - t0
                self.cond.notify_all()

    def _stop(self):
        with self.cond:
            self.queue.clear()
            if self.proc is not None:
                self.proc.kill()

    def get(self, name):
        """The ``subprocess.CompletedProcess`` of job ``name`` (``returncode`` None: it did not finish)."""
        self._spec(name)
        with self.cond:
            if name not in self.done and name != self.running:
                if name in self.queue:
                    self.queue.remove(name)
                self.queue.insert(0, name)
        self.start([])
        with self.cond:
            self.cond.wait_for(lambda: name in self.done)
            return self.done[name]


#: The session's background jobs.
BACKGROUND = Background()
