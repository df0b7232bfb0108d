"""Runs TensorFlow programs in child processes and supervises them.

A native TensorFlow crash (an abort in a kernel) kills the process it happens in. Training in a
child turns it into a failed task with a clear message, instead of a dead Airflow worker or a DAG
run stuck in "running". A multi-process cluster is supervised as a whole: every wait is bounded,
the first member to die takes the others down, and the message names it and quotes its log.
This is the only module that starts or watches processes.
"""

from __future__ import annotations

import collections
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

LOG_TAIL_LINES = 30
# A member prints this line once it is up (imports done, strategy or server created).
READY_MARKER = "STRATOFLOW-READY"
# Once one member is up, the others must be up within this long, or the cluster is failed
# (the default of `run_cluster`'s `ready_timeout_seconds`).
READY_TIMEOUT_SECONDS = 30.0
# No member up after this long fails the start (a member's imports take tens of seconds on a
# busy 2-core host: docs/BENCHMARKS.md, "Facts").
START_TIMEOUT_SECONDS = 240.0
# Members still running this long after the result member finished are killed.
SHUTDOWN_GRACE_SECONDS = 30.0
PORT_CLASH_MESSAGES = ("Could not start gRPC server", "Address already in use")
_PR_SET_PDEATHSIG = 1


class ChildProcessFailed(RuntimeError):
    """A child process exited non-zero or was killed; the message carries its last log lines."""


@dataclass
class Member:
    """One process of a cluster: `python -m module PAYLOAD RESULT` with its own environment."""

    name: str
    module: str
    env: dict[str, str] = field(default_factory=dict)
    # A long-running server: it never exits by itself and is stopped when the work is done.
    server: bool = False


def run_python_module(
    module: str,
    payload: dict[str, Any],
    *,
    name: str,
    env: dict[str, str] | None = None,
    timeout_seconds: float | None = None,
) -> dict[str, Any]:
    """Run `python -m module PAYLOAD_JSON RESULT_JSON` in a child and return its JSON result.

    The child's output is streamed line by line into this process's log (so it shows in the
    Airflow task log), and the child dies with this process (`PR_SET_PDEATHSIG`).

    Raises:
        ChildProcessFailed: non-zero exit, a signal, a timeout or no result; the message names
            the exit status and quotes the child's last log lines.
    """
    member = Member(name, module, env or {})
    return run_cluster(lambda: [member], name, payload, timeout_seconds=timeout_seconds)


def run_cluster(
    build_members: Callable[[], Sequence[Member]],
    result_from: str,
    payload: dict[str, Any],
    *,
    timeout_seconds: float | None = None,
    attempts: int = 3,
    ready_timeout_seconds: float = READY_TIMEOUT_SECONDS,
) -> dict[str, Any]:
    """Start a cluster, supervise it until member `result_from` finishes, return its result.

    Args:
        build_members: makes the members (called again, with fresh ports, after a port clash).
        result_from: the member whose result file is the cluster's result.
        payload: JSON-able input, the same file for every member.
        timeout_seconds: fail if the whole run takes longer.
        attempts: how many times a port clash at start-up is retried.
        ready_timeout_seconds: once one member is up, how long the others have to come up.

    Raises:
        ChildProcessFailed: a member died, never came up, or the run timed out; every other
            member has been killed by then.
    """
    for attempt in range(1, attempts + 1):
        try:
            return _Cluster(
                build_members(), result_from, payload, timeout_seconds, ready_timeout_seconds
            ).run()
        except _PortClash as clash:
            logger.warning("port clash at start-up (attempt %d/%d): %s", attempt, attempts, clash)
    raise ChildProcessFailed(f"the cluster could not get free ports in {attempts} attempts")


class _PortClash(Exception):
    pass


class _Running:
    """A started member: its process, a thread streaming its output, its last lines."""

    def __init__(self, member: Member, command: list[str], env: dict[str, str]):
        self.member = member
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self.ready_at: float | None = None
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=env,
            preexec_fn=die_with_parent(signal.SIGKILL),
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        logger.info(
            "%s started (pid %d): python -m %s", member.name, self.process.pid, member.module
        )

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.rstrip()
            if line == READY_MARKER:
                self.ready_at = time.monotonic()
                continue
            self.tail.append(line)
            logger.info("[%s] %s", self.member.name, line)

    def failure(self, what: str) -> str:
        # The reader ends when the output pipe closes: kill first, or a live child (a timeout, a
        # member that never came up) would keep it open for the whole join.
        self.kill()
        self.reader.join(timeout=5)  # the last lines are the ones that explain
        lines = "\n".join(self.tail)
        return (
            f"{self.member.name} (pid {self.process.pid}) {what}. "
            f"Last {len(self.tail)} lines of its log:\n{lines}"
        )

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


class _Cluster:
    def __init__(
        self,
        members: Sequence[Member],
        result_from: str,
        payload: dict[str, Any],
        timeout_seconds: float | None,
        ready_timeout_seconds: float = READY_TIMEOUT_SECONDS,
    ):
        self.members = members
        self.result_from = result_from
        self.payload = payload
        self.timeout_seconds = timeout_seconds
        self.ready_timeout_seconds = ready_timeout_seconds

    def run(self) -> dict[str, Any]:
        # Also the members' TMPDIR: what they leave there (a worker's scratch checkpoints) goes
        # with this folder, even when a member is killed before it could clean up.
        with tempfile.TemporaryDirectory(prefix="stratoflow-child-") as workdir:
            payload_path = Path(workdir) / "payload.json"
            payload_path.write_text(json.dumps(self.payload))
            started = time.time()
            running: dict[str, tuple[_Running, Path]] = {}
            try:
                for member in self.members:
                    result_path = Path(workdir) / f"result-{len(running)}.json"
                    command = [
                        sys.executable,
                        "-m",
                        member.module,
                        str(payload_path),
                        str(result_path),
                    ]
                    env = {
                        **os.environ,
                        "TMPDIR": workdir,
                        **member.env,
                        "STRATOFLOW_PROCESS_START": str(started),
                    }
                    running[member.name] = (_Running(member, command, env), result_path)
                self._supervise({name: entry[0] for name, entry in running.items()})
            finally:
                for child, _ in running.values():
                    child.kill()
            chief, result_path = running[self.result_from]
            result = json.loads(result_path.read_text()) if result_path.exists() else None
            if result is not None and "error" in result:
                raise ChildProcessFailed(
                    f"{self.result_from} (pid {chief.process.pid}) failed: {result['error']}"
                )
            if result is None:
                raise ChildProcessFailed(chief.failure("exited 0 but wrote no result"))
            return dict(result)

    def _supervise(self, running: dict[str, _Running]) -> None:
        """Return once the result member exited 0; raise as soon as anything goes wrong."""
        start = time.monotonic()
        result_member = running[self.result_from]
        finished_at: float | None = None
        while True:
            now = time.monotonic()
            for child in running.values():
                returncode = child.process.poll()
                if returncode is None:
                    continue
                if child is result_member:
                    if returncode == 2:
                        return  # it reported its own error in its result file; `run` raises it
                    if returncode != 0:
                        self._fail(child, returncode, running)
                elif returncode != 0 or child.member.server:
                    self._fail(child, returncode, running)
            if result_member.process.poll() == 0:
                finished_at = finished_at or now
                others = [
                    c for c in running.values() if c is not result_member and not c.member.server
                ]
                if all(c.process.poll() is not None for c in others):
                    return
                if now - finished_at > SHUTDOWN_GRACE_SECONDS:
                    logger.warning("members still running after the result: killing them")
                    return
            self._check_start(running, now - start)
            if self.timeout_seconds and now - start > self.timeout_seconds:
                raise ChildProcessFailed(
                    result_member.failure(
                        f"ran past its {self.timeout_seconds:.0f} s limit; killed"
                    )
                )
            time.sleep(0.1)

    def _fail(self, child: _Running, returncode: int, running: dict[str, _Running]) -> None:
        for other in running.values():
            if other is not child:
                other.kill()
        message = child.failure(_describe_exit(returncode))
        if any(clash in message for clash in PORT_CLASH_MESSAGES):
            raise _PortClash(message)
        raise ChildProcessFailed(message)

    def _check_start(self, running: dict[str, _Running], elapsed: float) -> None:
        if len(running) == 1:
            return  # a single process has no peers to wait for
        ready = [c.ready_at for c in running.values() if c.ready_at is not None]
        waiting = [c for c in running.values() if c.ready_at is None and c.process.poll() is None]
        if not waiting:
            return
        if ready and time.monotonic() - min(ready) > self.ready_timeout_seconds:
            names = ", ".join(c.member.name for c in waiting)
            raise ChildProcessFailed(
                waiting[0].failure(
                    f"never came up: {names} not ready {self.ready_timeout_seconds:.0f} s after "
                    "the first member was"
                )
            )
        if not ready and elapsed > START_TIMEOUT_SECONDS:
            raise ChildProcessFailed(
                waiting[0].failure(
                    f"no cluster member came up within {START_TIMEOUT_SECONDS:.0f} s"
                )
            )


def _describe_exit(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with status {returncode}"
    signal_name = signal.Signals(-returncode).name
    if signal_name in ("SIGABRT", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE"):
        return f"crashed with {signal_name} (a native crash inside TensorFlow)"
    return f"was killed by {signal_name}"


def die_with_parent(signum: int) -> Callable[[], None]:
    """A `preexec_fn` giving the child signal `signum` when its starter dies, so no orphan is left.

    libc is loaded here, in the parent: the child may already run as another OS user that cannot
    read this interpreter's files.
    """
    libc = ctypes.CDLL("libc.so.6", use_errno=True)

    def set_parent_death_signal() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signum)

    return set_parent_death_signal
