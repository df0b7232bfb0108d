"""Shared helpers for tests that start real processes.

Finding this test's training, server and echo children (now, or every one seen while a run went
on), a private temp folder to count what a run leaves behind, and the kill-mid-run harness.
The fixtures are registered in `tests/conftest.py`.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from stratoflow.config import names

TRAINING_MODULE = "stratoflow.training.worker"
SERVER_MODULE = "stratoflow.distributed.server"
ECHO_MODULE = "tests.support.echo_program"
# The first task's child: the pipeline's dataset builder and the own-code check.
OWN_CODE_CHECK_MODULE = "stratoflow.training.own_code_check"
# A warm spare (`stratoflow.distributed.spares`): its command line stays the spare's after it
# became a member, and its TF_CONFIG is the one it took on, not the one it started with.
SPARE_MODULE = "stratoflow.distributed.spares"
CHILD_MODULES = (TRAINING_MODULE, SERVER_MODULE, ECHO_MODULE, OWN_CODE_CHECK_MODULE, SPARE_MODULE)


def _module_of(process: psutil.Process) -> str | None:
    command = " ".join(process.cmdline())
    return next((module for module in CHILD_MODULES if module in command), None)


def cluster_children() -> list[psutil.Process]:
    """This process's live descendants that run a training, server, echo or own-code check
    program."""
    children = []
    for child in psutil.Process().children(recursive=True):
        try:
            if _module_of(child):
                children.append(child)
        except psutil.NoSuchProcess:
            continue
    return children


def tf_config_of(process: psutil.Process) -> dict[str, Any] | None:
    """The TF_CONFIG a child was started with, parsed (None without one)."""
    raw = process.environ().get("TF_CONFIG")
    return json.loads(raw) if raw else None


def cluster_member(job: str, index: int) -> psutil.Process:
    """The one child of this process started as task `index` of `job` (by its TF_CONFIG)."""
    (member,) = [
        child
        for child in cluster_children()
        if (tf_config_of(child) or {}).get("task") == {"type": job, "index": index}
    ]
    return member


@dataclass(frozen=True)
class SeenChild:
    """A child seen while a run went on: its pid, the module it ran, its TF_CONFIG."""

    pid: int
    module: str
    tf_config: dict[str, Any] | None


class ChildWatcher:
    """Records every training/server/echo descendant of this process until stopped.

    Polls every `interval` seconds: cluster members live for the whole run, far longer.
    Descendants include grandchildren, so it also sees the children of an `airflow dags test`.
    """

    def __init__(self, interval: float = 0.1):
        self.interval = interval
        self.seen: dict[int, SeenChild] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> ChildWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def children(self, module: str | None = None) -> list[SeenChild]:
        """The children seen so far, optionally only those running `module`."""
        return [child for child in self.seen.values() if module in (None, child.module)]

    def _watch(self) -> None:
        while not self._stop.is_set():
            for child in psutil.Process().children(recursive=True):
                if child.pid in self.seen:
                    continue
                try:
                    module = _module_of(child)
                    if module:
                        self.seen[child.pid] = SeenChild(child.pid, module, tf_config_of(child))
                except psutil.Error:  # gone, or a zombie, before we could look
                    continue
            self._stop.wait(self.interval)


@pytest.fixture
def child_watcher() -> Iterator[ChildWatcher]:
    """A running `ChildWatcher` for the test; stopped when the test ends."""
    watcher = ChildWatcher().start()
    try:
        yield watcher
    finally:
        watcher.stop()


@pytest.fixture
def private_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty temp folder for this test, its children and theirs (TMPDIR and `tempfile`)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def restorable_epoch(run_dir: Path) -> int:
    """The epoch whose checkpoint a restart of the run in `run_dir` would restore, or 0.

    Read as TensorFlow's `latest_checkpoint` reads it: the `checkpoints/checkpoint` state file,
    which the checkpoint manager rewrites (atomically) only once a save is complete. The
    `ckpt-<epoch>.index` file appears before that, so a kill as soon as it exists can rightly
    resume from the epoch before (a CI run of 2026-12-05 did: `ckpt-2.index` seen, resumed from 1).
    """
    state = run_dir / "checkpoints" / "checkpoint"
    try:
        first_line = state.read_text().splitlines()[0]  # model_checkpoint_path: "ckpt-<epoch>"
    except (OSError, IndexError):
        return 0
    return int(first_line.rsplit("-", 1)[1].rstrip('"'))


def leftovers(folder: Path) -> list[str]:
    """The stratoflow folders (child work folders, worker scratch) left in temp folder `folder`."""
    return sorted(path.name for path in folder.glob("stratoflow-*"))


@dataclass(frozen=True)
class KilledRun:
    """How a run went whose child was killed: the error raised and how fast it came."""

    error: BaseException
    victim_pid: int
    seconds_to_failure: float


def kill_during(
    run: Callable[[], object],
    when: Callable[[], bool],
    victim: Callable[[list[psutil.Process]], psutil.Process],
    *,
    wait_seconds: float = 400,
    fail_within: float = 60,
) -> KilledRun:
    """Start `run` in a thread, SIGKILL the child `victim` picks once `when()` holds.

    Args:
        run: the work that starts children (e.g. a `stratoflow.tasks.train.train` call); it must
        raise.
        when: the moment to kill, e.g. the first checkpoint exists.
        victim: picks the process to kill from `cluster_children()`.
        wait_seconds: how long `when()` may take to hold.
        fail_within: how long `run` may take to raise after the kill.

    Returns:
        What `run` raised, the victim's pid, and the seconds from the kill to the exception.
    """
    outcome: dict[str, Any] = {}

    def attempt() -> None:
        try:
            run()
        except BaseException as error:  # noqa: BLE001 - handed to the test, which checks it
            outcome["failed_at"] = time.monotonic()
            outcome["error"] = error

    thread = threading.Thread(target=attempt)
    thread.start()
    deadline = time.monotonic() + wait_seconds
    while not when():
        assert thread.is_alive(), f"the run ended before the kill: {outcome.get('error')!r}"
        assert time.monotonic() < deadline, "the moment to kill never came"
        time.sleep(0.05)
    target = victim(cluster_children())
    killed_at = time.monotonic()
    target.kill()
    thread.join(fail_within)
    assert not thread.is_alive(), f"still running {fail_within} s after the kill"
    assert "error" in outcome, "the run succeeded although a child was killed"
    return KilledRun(outcome["error"], target.pid, outcome["failed_at"] - killed_at)


def run_dag(mlflow_client: Any, pipeline: str, conf: dict[str, Any]) -> Any:
    """Run `pipeline` once through Airflow (`make run`'s runner) and return the MLflow run it
    made: the one run of the pipeline's experiment that was not there before, whatever ran
    earlier in the session."""
    from stratoflow.cli import runner

    def runs() -> dict[str, Any]:
        experiment = mlflow_client.get_experiment_by_name(names.experiment_name(pipeline))
        if experiment is None:
            return {}
        return {r.info.run_id: r for r in mlflow_client.search_runs([experiment.experiment_id])}

    before = runs()
    assert runner.run_pipeline(pipeline, conf) == 0
    (made,) = [run for run_id, run in runs().items() if run_id not in before]
    return made


STRATOFLOW = Path(sys.executable).parent / "stratoflow"


class ServeModel:
    """A `stratoflow serve-model` process: stdout read line by line, stderr to a file."""

    def __init__(self, pipeline: str, *flags: str, env: dict[str, str], log: Path):
        self.log = log
        self.lines: list[str] = []
        self.banner_done = threading.Event()
        self.process = subprocess.Popen(
            [str(STRATOFLOW), "serve-model", pipeline, "--port", "0", *flags],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log.open("w"),
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("Stop it with"):
                self.banner_done.set()
        self.banner_done.set()  # ended before: the test reads why from the log

    def wait_until_serving(self, timeout: float = 300) -> str:
        """The URL the banner names, once the server answers."""
        assert self.banner_done.wait(timeout), f"no banner after {timeout} s: {self.tail()}"
        if not any(line.startswith("Stop it with") for line in self.lines):
            code = self.process.wait(30)
            pytest.fail(f"serve-model exited {code} before serving: {self.tail()}")
        (url,) = {m for line in self.lines for m in re.findall(r"http://[\d.]+:\d+", line)}
        return url

    def example_curl(self) -> list[str]:
        (line,) = [line.strip() for line in self.lines if line.strip().startswith("curl ")]
        return shlex.split(line)

    def tree(self) -> list[psutil.Process]:
        """The scoring server's processes (the CLI's descendants)."""
        return psutil.Process(self.process.pid).children(recursive=True)

    def tail(self) -> str:
        return "\n".join(self.lines[-20:]) + "\n" + self.log.read_text()[-3000:]

    def kill(self) -> None:
        """SIGKILL what is left of it (a test that failed midway)."""
        if self.process.poll() is None:
            for process in self.tree():
                with contextlib.suppress(psutil.Error):
                    process.kill()
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def running(
    args: list[str], env: Mapping[str, str], log_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """A server process for the duration of the block (output in `log_path`, started in its
    folder), then stopped: SIGTERM, SIGKILL after 30 s."""
    with log_path.open("w") as log:
        server = subprocess.Popen(
            args, env=dict(env), cwd=log_path.parent, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            yield server
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
