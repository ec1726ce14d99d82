"""Subprocess jobs that tests read, played in the background from the start of the session (tests/conftest.py
queues those of the selected tests at collection), so they overlap with the in-process tests: XLA compiles on
one core, CI has two. One module (imported as ``tests.background`` by conftest and the tests alike) holds the
process's :data:`BACKGROUND`.

Under pytest-xdist (``-n 2``: the README's test command) the workers share one set of jobs: each job runs once per
session, in whichever process asks first, and every process reads its result. The processes share a directory
(its path in :data:`BASE_ENV`, set by the first process to import this module, the xdist controller, and inherited
by the workers it starts), where a job's result is one JSON file, and they play the jobs one at a time in all (a
lane lock), so the jobs never take more than the one core they take without xdist.
"""

import atexit
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The environment variable naming the session's shared job directory (set by the first process of the session).
BASE_ENV = "JAXOPT_MARL_TEST_BACKGROUND"
#: Seconds a job may run before it is killed (its test then fails, naming it).
JOB_TIMEOUT_S = 900
#: Seconds between a waiting test's checks for a job another process plays.
POLL_S = 0.5


def _file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


class Background:
    """Subprocess jobs (``python <argv>`` from the repository root) played one at a time by a background thread,
    in the order queued; :meth:`get` waits for a job (queued first, ahead of the others, if not yet started).

    A job is a name and a ``(argv, env overrides)`` spec, registered by a test module at import (the smoke runs:
    tests/conftest.py). tests/conftest.py's ``pytest_collection_modifyitems`` queues the jobs of the selected
    tests: ``smoke_run`` / ``smoke_runs`` users and tests marked ``@pytest.mark.background(name)`` (``name``
    formatted with the test's parameters).

    Across processes (pytest-xdist workers): ``base/jobs/<name>.json`` is a finished job's result (written
    atomically), ``base/jobs/<name>.wanted`` says a test waits for it (played first by whichever process holds the
    lane next), and ``base/jobs/lane.lock`` is held while a job plays."""

    def __init__(self):
        shared = os.environ.get(BASE_ENV)
        if shared:
            self.base = Path(shared)
        else:
            self.base = Path(tempfile.mkdtemp(prefix="jaxopt-marl-tests-"))
            os.environ[BASE_ENV] = str(self.base)  # the xdist workers, started later, inherit it
            atexit.register(shutil.rmtree, self.base, ignore_errors=True)
        self.jobs = self.base / "jobs"
        self.jobs.mkdir(parents=True, exist_ok=True)
        atexit.register(self._stop)
        self.cond = threading.Condition()
        self.specs, self.queue, self.done = {}, [], {}
        self.running, self.proc, self.thread = None, None, None

    def register(self, name, argv, env=None):
        self.specs[name] = (list(argv), dict(env or {}))

    def _spec(self, name):
        if name not in self.specs:
            raise KeyError(f"no background job {name!r}; registered: {sorted(self.specs)}")
        return self.specs[name]

    def _result_path(self, name) -> Path:
        return self.jobs / f"{_file_name(name)}.json"

    def _read(self, name):
        """The finished job's ``CompletedProcess`` from its result file, or None (not finished)."""
        path = self._result_path(name)
        if not path.exists():
            return None
        d = json.loads(path.read_text())
        return subprocess.CompletedProcess(d["argv"], d["returncode"], d["stdout"], d["stderr"])

    @property
    def seconds(self) -> dict:
        """name -> wall seconds each finished job of the session ran (every process's), in the order they ended."""
        rows = []
        for path in self.jobs.glob("*.json"):
            d = json.loads(path.read_text())
            rows.append((d["ended"], d["name"], d["seconds"]))
        return {name: secs for _, name, secs in sorted(rows)}

    def start(self, names):
        """Queue ``names`` (in order) and start the background player."""
        for name in names:
            self._spec(name)  # unknown names fail here, in the caller
        with self.cond:
            self.queue += [n for n in dict.fromkeys(names) if n not in self.queue and n not in self.done]
            if self.thread is None and self.queue:
                self.thread = threading.Thread(target=self._player, name="background-jobs", daemon=True)
                self.thread.start()

    def _next(self):
        """The next job to play (a wanted one first), or None; drops the queued jobs another process finished."""
        with self.cond:
            for name in list(self.queue):
                result = self._read(name)
                if result is not None:
                    self.queue.remove(name)
                    self.done[name] = result
                    self.cond.notify_all()
            wanted = [n for n in self.queue if (self.jobs / f"{_file_name(n)}.wanted").exists()]
            return (wanted or self.queue or [None])[0]

    def _player(self):
        lane = open(self.jobs / "lane.lock", "w")
        try:
            while True:
                fcntl.flock(lane, fcntl.LOCK_EX)  # one job at a time in the whole session
                try:
                    with self.cond:
                        name = self._next()
                        if name is None:
                            self.thread = None
                            return
                        self.queue.remove(name)
                        self.running = name
                        argv, extra = self.specs[name]
                    result, secs = self._play(argv, extra)
                    self._write(name, argv, result, secs)
                    with self.cond:
                        self.running = None
                        self.done[name] = result
                        self.cond.notify_all()
                finally:
                    fcntl.flock(lane, fcntl.LOCK_UN)
                time.sleep(0.05)  # let another process's waiting player take the lane
        finally:
            lane.close()

    def _play(self, argv, extra):
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
            stdout, stderr = self.proc.communicate(timeout=JOB_TIMEOUT_S)
            result = subprocess.CompletedProcess(argv, self.proc.returncode, stdout, stderr)
        except Exception as e:  # reported by the test that asks
            if self.proc is not None:
                self.proc.kill()
            result = subprocess.CompletedProcess(argv, None, "", repr(e))
        with self.cond:
            self.proc = None
        return result, time.monotonic() - t0

    def _write(self, name, argv, result, secs):
        d = {
            "name": name,
            "argv": list(argv),
            "returncode": result.returncode,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "seconds": secs,
            "ended": time.time(),
        }
        path = self._result_path(name)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(d))
        os.replace(tmp, path)

    def _stop(self):
        with self.cond:
            self.queue.clear()
            if self.proc is not None:
                self.proc.kill()

    def get(self, name):
        """The ``subprocess.CompletedProcess`` of job ``name`` (``returncode`` None: it did not finish), played here
        unless another process plays or played it."""
        self._spec(name)
        with self.cond:
            if name in self.done:
                return self.done[name]
            (self.jobs / f"{_file_name(name)}.wanted").touch()
            if name != self.running:
                if name in self.queue:
                    self.queue.remove(name)
                self.queue.insert(0, name)
        self.start([])
        with self.cond:
            while name not in self.done:
                result = self._read(name)  # played by another process
                if result is not None:
                    self.done[name] = result
                    break
                if self.thread is None and name not in self.queue and name != self.running:
                    self.queue.insert(0, name)  # this process's player ended while another process held it
                    self.start([])
                self.cond.wait(POLL_S)
            return self.done[name]


#: The process's background jobs.
BACKGROUND = Background()
