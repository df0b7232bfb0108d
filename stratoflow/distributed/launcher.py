"""Runs TensorFlow programs in child processes and supervises them.

A native TensorFlow crash (an abort in a kernel) kills the process it happens in. Training in a
child turns it into a failed task with a clear message, instead of a dead Airflow worker or a DAG
run stuck in "running". A multi-process cluster is supervised as a whole: every wait is bounded,
the first member to die takes the others down, and the message names it and quotes its log.

A member that was killed or lost (not one that failed with an error) is recovered inside the
task, up to the run's `max_restarts`: a parameter-server worker is started again in place and
rejoins while training goes on (TensorFlow's coordinator reschedules its steps); any other loss
restarts the whole cluster, which resumes from the last checkpoint. The supervision here is
shared with the Ray launcher (`stratoflow.distributed.ray_launcher`), whose members are Ray
actors instead of local processes.
Every member starts from the allowlisted environment of `member_environment` (pipeline code
runs in it), not from this process's, which holds the deployment's secrets.
This is the only module that starts or watches local processes.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratoflow.config import clusters
from stratoflow.config.strategies import ClusterPlan
from stratoflow.distributed.cluster import check_reachable, host_share, member_env, plan_layout
from stratoflow.distributed.member_environment import pipeline_environment
from stratoflow.distributed.processes import start_reading_lines
from stratoflow.distributed.protocol import (
    FIRST_STEP_MARKER,
    PROCESS_START_ENV,
    READY_MARKER,
    ReportSink,
    Restarts,
    TrainingPayload,
    TrainingResult,
    read_report,
)
from stratoflow.distributed.spares import Spares, wanted_for

logger = logging.getLogger(__name__)

LOG_TAIL_LINES = 30
# Once one member is up, the others must be up within this long, or the cluster is failed
# (the default of `run_cluster`'s `ready_timeout_seconds`).
READY_TIMEOUT_SECONDS = 30.0
# No member up after this long fails the start (a member's imports take tens of seconds on a
# busy 2-core host: docs/BENCHMARKS.md, "Facts").
START_TIMEOUT_SECONDS = 240.0
# Members still running this long after the result member finished are killed.
SHUTDOWN_GRACE_SECONDS = 30.0
# The result member's errors that mean a peer went away (killed, its node dead or cut off).
PEER_LOSS_ERRORS = ("UnavailableError", "AbortedError", "DeadlineExceededError")
# How long a peer's own loss may take to show after the result member failed on it.
PEER_LOSS_GRACE_SECONDS = 30.0
PORT_CLASH_MESSAGES = ("Could not start gRPC server", "Address already in use")


class ChildProcessFailed(RuntimeError):
    """A child process exited non-zero or was killed; the message carries its last log lines."""


class MemberLost(ChildProcessFailed):
    """A member was killed by a signal or lost with its node: a restart may get past it."""

    def __init__(self, message: str, member: str):
        super().__init__(message)
        self.member = member


@dataclass
class Member:
    """One process of a cluster: `python -m module PAYLOAD RESULT` with its own environment."""

    name: str
    module: str
    env: dict[str, str] = field(default_factory=dict)
    # A long-running server: it never exits by itself and is stopped when the work is done.
    server: bool = False
    # A parameter-server worker: when lost, it is started again in place (same address) and
    # rejoins; the coordinator reruns its steps meanwhile.
    rejoins: bool = False


def run_python_module(
    module: str,
    payload: dict[str, Any] | str,
    *,
    name: str,
    env: dict[str, str] | None = None,
    timeout_seconds: float | None = None,
) -> dict[str, Any]:
    """Run `python -m module PAYLOAD_JSON RESULT_JSON` in a child and return its JSON result.

    The child's output is streamed line by line into this process's log (so it shows in the
    Airflow task log), and the child dies with this process (`PR_SET_PDEATHSIG`). Like every
    member, it gets the allowlisted environment (`member_environment`) plus `env`.

    Raises:
        ChildProcessFailed: non-zero exit, a signal, a timeout or no result; the message names
            the exit status and quotes the child's last log lines.
    """
    member = Member(name, module, env or {})
    return run_cluster(lambda: [member], name, payload, timeout_seconds=timeout_seconds)


def run_cluster(
    build_members: Callable[[], Sequence[Member]],
    result_from: str,
    payload: dict[str, Any] | str,
    *,
    timeout_seconds: float | None = None,
    attempts: int = 3,
    ready_timeout_seconds: float = READY_TIMEOUT_SECONDS,
    restarts: Restarts | None = None,
    warm_spares: bool = False,
    reports: ReportSink | None = None,
) -> dict[str, Any]:
    """Start a cluster, supervise it until member `result_from` finishes, return its result.

    Args:
        build_members: makes the members (called again, with fresh ports, after a port clash
            or for a restart).
        result_from: the member whose result file is the cluster's result.
        payload: JSON-able input, or its JSON text: the same file for every member.
        timeout_seconds: fail if one start of the cluster takes longer.
        attempts: how many times a port clash at start-up is retried.
        ready_timeout_seconds: once one member is up, how long the others have to come up.
        restarts: the budget for members that are killed or lost (none by default); it records
            each restart, also when the run fails in the end.
        warm_spares: keep spare processes with TensorFlow imported once training runs; a member
            that starts again becomes one of them (`stratoflow.distributed.spares`).
        reports: takes the members' reports (`protocol.report`) as they come, from the thread
            that reads that member's output.

    Raises:
        ChildProcessFailed: a member failed, never came up, or the run timed out, or members
            were lost more often than `restarts` allows; every other member has been killed by
            then.
    """

    budget = restarts or Restarts(0)
    # Spares outlive a cluster: a restarted cluster's members become the ones kept for it.
    spares = Spares(pipeline_environment(os.environ)) if warm_spares else None

    def start_once() -> dict[str, Any]:
        cluster = _LocalCluster(
            build_members(),
            result_from,
            payload,
            timeout_seconds,
            ready_timeout_seconds,
            budget,
            reports,
        )
        cluster.spares = spares
        return cluster.run()

    try:
        return with_restarts(lambda: retry_port_clashes(start_once, attempts), budget)
    finally:
        if spares is not None:
            spares.close()


def retry_port_clashes(start_once: Callable[[], dict[str, Any]], attempts: int) -> dict[str, Any]:
    """Run `start_once` (which picks fresh ports each time) until no member's port was taken.

    Raises:
        ChildProcessFailed: every one of the `attempts` clashed.
    """
    for attempt in range(1, attempts + 1):
        try:
            return start_once()
        except PortClash as clash:
            logger.warning("port clash at start-up (attempt %d/%d): %s", attempt, attempts, clash)
    raise ChildProcessFailed(f"the cluster could not get free ports in {attempts} attempts")


def with_restarts(start_once: Callable[[], dict[str, Any]], restarts: Restarts) -> dict[str, Any]:
    """Run `start_once` again after each lost member while `restarts` allows; its result.

    Raises:
        MemberLost: a member was lost once more than `restarts` allows (the message says so).
        ChildProcessFailed: any other failure, at once (an error does not go away by itself).
    """
    while True:
        try:
            return start_once()
        except MemberLost as lost:
            if not restarts.allowed():
                if restarts.limit:
                    raise MemberLost(
                        f"{lost}\n(no restart left: max_restarts {restarts.limit} spent)",
                        lost.member,
                    ) from None
                raise
            restarts.record(lost.member, str(lost).split(". Last", 1)[0], in_place=False)


class PortClash(Exception):
    """A member could not bind its port (another process took it): start again, fresh ports."""


class Running:
    """A started member as the supervision sees it (a local process, or a Ray actor's).

    Subclasses start the member and implement `poll`, `kill`, `result` and `where`; the reader
    of its output calls `take_line` with every line. A report line goes to `reports`.
    """

    def __init__(self, member: Member, reports: ReportSink | None = None):
        self.member = member
        self.reports = reports
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self.ready_at: float | None = None
        self.first_step_at: float | None = None
        # When it was started again in place (a rejoining parameter-server worker).
        self.restarted_at: float | None = None

    def take_line(self, line: str) -> None:
        if line == READY_MARKER:
            self.ready_at = time.monotonic()
            return
        if line == FIRST_STEP_MARKER:
            self.first_step_at = time.monotonic()
            return
        found = read_report(line)
        if found is not None:
            if self.reports is not None:
                self.reports(*found)
            return
        self.tail.append(line)
        logger.info("[%s] %s", self.member.name, line)

    def refresh(self) -> None:
        """Take what the member did since the last call (a Ray actor is asked; a local process
        needs nothing)."""

    def poll(self) -> int | None:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        raise NotImplementedError

    def result(self) -> dict[str, Any] | None:
        raise NotImplementedError

    def where(self) -> str:
        raise NotImplementedError

    def lost_reason(self) -> str | None:
        """Why the member is gone although its process may not have exited (its node)."""
        return None

    def drain(self) -> None:
        """Wait briefly for the last lines of a member that is being given up."""

    def failure(self, what: str) -> str:
        self.kill()
        self.drain()  # the last lines are the ones that explain
        lines = "\n".join(self.tail)
        return (
            f"{self.member.name} ({self.where()}) {what}. "
            f"Last {len(self.tail)} lines of its log:\n{lines}"
        )


class _Running(Running):
    """A started local process, a thread streaming its output."""

    def __init__(
        self,
        member: Member,
        command: list[str],
        env: dict[str, str],
        spares: Spares | None = None,
        reports: ReportSink | None = None,
    ):
        super().__init__(member, reports)
        self.command, self.env, self.spares = command, env, spares
        self._start()

    def _start(self) -> None:
        spare = self.spares.take(self.member.module) if self.spares is not None else None
        if spare is not None:
            spare.become(self.command, self.env, self.take_line)
            self.process, self.reader = spare.process, spare.reader
            logger.info(
                "%s started from a spare (pid %d, %s): python -m %s",
                self.member.name,
                self.process.pid,
                "TensorFlow imported" if spare.warm else "still importing TensorFlow",
                self.member.module,
            )
            return
        self.process, self.reader = start_reading_lines(self.command, self.env, self.take_line)
        logger.info(
            "%s started (pid %d): python -m %s",
            self.member.name,
            self.process.pid,
            self.member.module,
        )

    def poll(self) -> int | None:
        return self.process.poll()

    def restart(self) -> None:
        self.kill()
        self.ready_at, self.restarted_at = None, time.monotonic()
        self._start()

    def result(self) -> dict[str, Any] | None:
        path = Path(self.command[-1])
        return json.loads(path.read_text()) if path.exists() else None

    def where(self) -> str:
        return f"pid {self.process.pid}"

    def drain(self) -> None:
        # The reader ends when the output pipe closes: `failure` kills first, or a live child
        # would keep it open for the whole join.
        self.reader.join(timeout=5)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


class Cluster:
    """Supervises started members (`Running`) until the result member is done."""

    def __init__(
        self,
        members: Sequence[Member],
        result_from: str,
        payload: dict[str, Any] | str,
        timeout_seconds: float | None,
        ready_timeout_seconds: float = READY_TIMEOUT_SECONDS,
        restarts: Restarts | None = None,
        reports: ReportSink | None = None,
    ):
        self.members = members
        self.result_from = result_from
        # Serialised once: every member, and every restart, reads this text.
        self.payload = payload if isinstance(payload, str) else json.dumps(payload)
        self.timeout_seconds = timeout_seconds
        self.ready_timeout_seconds = ready_timeout_seconds
        self.restarts = restarts or Restarts(0)
        self.reports = reports
        # Warm spares to keep once training runs (the local launcher's, when the run asks).
        self.spares: Spares | None = None

    def result_of(self, chief: Running) -> dict[str, Any]:
        """The result member's result, or the error it reported, raised."""
        result = chief.result()
        if result is not None and "error" in result:
            message = f"{self.result_from} ({chief.where()}) failed: {result['error']}"
            if _is_peer_loss(result["error"]):
                raise MemberLost(message, self.result_from)
            raise ChildProcessFailed(message)
        if result is None:
            raise ChildProcessFailed(chief.failure("exited 0 but wrote no result"))
        return dict(result)

    def supervise(self, running: dict[str, Running]) -> None:
        """Return once the result member exited 0; raise as soon as anything goes wrong."""
        start = time.monotonic()
        result_member = running[self.result_from]
        finished_at: float | None = None
        while True:
            now = time.monotonic()
            for child in running.values():
                child.refresh()
            self._note_training(running, result_member)
            self._keep_spares(running, result_member)
            for child in running.values():
                returncode = child.poll()
                lost = child.lost_reason()
                if returncode is None and lost is None:
                    continue
                if child is result_member and lost is None:
                    if returncode == 2:
                        # It reported its own error in its result file; `run` raises it, unless
                        # that error was a peer going away: then the peer is named (and lost).
                        self._blame_lost_peer(child, running)
                        return
                    if returncode != 0:
                        self._fail(child, returncode, running)
                elif lost is not None or returncode != 0 or child.member.server:
                    if self._rejoin(child, returncode, result_member):
                        continue
                    self._fail(child, returncode, running)
            if result_member.poll() == 0:
                finished_at = finished_at or now
                others = [
                    c for c in running.values() if c is not result_member and not c.member.server
                ]
                if all(c.poll() is not None for c in others):
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

    def _blame_lost_peer(self, chief: Running, running: dict[str, Running]) -> None:
        """The chief failed because a peer went away: wait a little for the peer's own loss to
        show (a dead node takes Ray seconds to report) and fail naming it."""
        result = chief.result()
        if not (result and _is_peer_loss(str(result.get("error", "")))):
            return
        deadline = time.monotonic() + PEER_LOSS_GRACE_SECONDS
        while time.monotonic() < deadline:
            for child in running.values():
                if child is chief:
                    continue
                child.refresh()
                returncode = child.poll()
                if child.lost_reason() is not None or (returncode is not None and returncode != 0):
                    self._fail(child, returncode, running)
            time.sleep(0.2)

    def _note_training(self, running: dict[str, Running], result_member: Running) -> None:
        if result_member.first_step_at is not None:
            self.restarts.training_again(in_place=False)
        for child in running.values():
            if child.restarted_at is not None and child.ready_at is not None:
                self.restarts.training_again(in_place=True, member=child.member.name)
                child.restarted_at = None

    def _keep_spares(self, running: dict[str, Running], result_member: Running) -> None:
        """Once training runs and no member is starting again, keep the cluster's spares."""
        if result_member.first_step_at is None:
            return
        if any(child.restarted_at is not None for child in running.values()):
            return  # a recovery is under way: it gets the cores first
        self.keep_spares(running)

    def keep_spares(self, running: dict[str, Running]) -> None:
        """Keep the spares the run asked for: the local launcher's pool, for the program of the
        members a loss starts again (a rejoining worker's, else the result member's)."""
        if self.spares is None:
            return
        rejoining = [child.member for child in running.values() if child.member.rejoins]
        module = (rejoining[0] if rejoining else running[self.result_from].member).module
        self.spares.fill(wanted_for(len(rejoining), len(running)), module)

    def _rejoin(self, child: Running, returncode: int | None, result_member: Running) -> bool:
        """Start a lost parameter-server worker again in place, if it may; True if it was."""
        if not (
            child.member.rejoins
            and child.lost_reason() is None
            and _is_loss(returncode)
            and result_member.poll() is None
            and self.restarts.allowed()
        ):
            return False
        assert returncode is not None
        self.restarts.record(child.member.name, _describe_exit(returncode), in_place=True)
        child.restart()
        return True

    def _fail(self, child: Running, returncode: int | None, running: dict[str, Running]) -> None:
        for other in running.values():
            if other is not child:
                other.kill()
        lost = child.lost_reason()
        message = child.failure(lost or _describe_exit(returncode or 0))
        if any(clash in message for clash in PORT_CLASH_MESSAGES):
            raise PortClash(message)
        if lost is not None or _is_loss(returncode):
            raise MemberLost(message, child.member.name)
        raise ChildProcessFailed(message)

    def _check_start(self, running: dict[str, Running], elapsed: float) -> None:
        if len(running) == 1:
            return  # a single process has no peers to wait for
        now = time.monotonic()
        for child in running.values():
            if child.restarted_at is not None and now - child.restarted_at > START_TIMEOUT_SECONDS:
                raise ChildProcessFailed(
                    child.failure(
                        f"was started again but not up within {START_TIMEOUT_SECONDS:.0f} s"
                    )
                )
        ready = [c.ready_at for c in running.values() if c.ready_at is not None]
        waiting = [
            c
            for c in running.values()
            if c.ready_at is None and c.poll() is None and c.restarted_at is None
        ]
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


class _LocalCluster(Cluster):
    """The members as child processes of this one."""

    def run(self) -> dict[str, Any]:
        # Also the members' TMPDIR: what they leave there (a worker's scratch checkpoints) goes
        # with this folder, even when a member is killed before it could clean up.
        with tempfile.TemporaryDirectory(prefix="stratoflow-child-") as workdir:
            payload_path = Path(workdir) / "payload.json"
            payload_path.write_text(self.payload)
            started = time.time()
            # Pipeline code runs in every member: the allowlist, not this process's secrets.
            inherited = pipeline_environment(os.environ)
            running: dict[str, Running] = {}
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
                        **inherited,
                        "TMPDIR": workdir,
                        **member.env,
                        PROCESS_START_ENV: str(started),
                    }
                    running[member.name] = _Running(member, command, env, self.spares, self.reports)
                self.supervise(running)
                # Its last reports may still be on their way through the output reader.
                running[self.result_from].drain()
            finally:
                for child in running.values():
                    child.kill()
            return self.result_of(running[self.result_from])


class LocalLauncher:
    """The `local` launcher: a run's members as child processes of this task."""

    def run(
        self,
        plan: ClusterPlan,
        payload: TrainingPayload,
        restarts: Restarts,
        reports: ReportSink | None = None,
    ) -> TrainingResult:
        """Run `plan`'s members here (`stratoflow.distributed.protocol.Launcher.run`).

        Raises:
            ClusterUnreachableError: a server of the plan's standing cluster does not answer.
            ChildProcessFailed: a member failed, or was lost more often than `restarts` allows.
        """
        # By name: the addresses are the deployment's, read here, never from the run's conf.
        standing = clusters.standing_cluster(plan.standing_cluster) if plan.standing_cluster else {}
        check_reachable(standing)
        result = run_cluster(
            lambda: local_members(plan, standing),
            plan.result_from,
            payload.to_json(),
            restarts=restarts,
            warm_spares=payload.plan.training.warm_spares,
            reports=reports,
        )
        # Every member ran on this host.
        return TrainingResult.from_dict({**result, "nodes": {"all_members": socket.gethostname()}})


def local_members(plan: ClusterPlan, standing: dict[str, list[str]] | None = None) -> list[Member]:
    """`plan`'s members on this host, with fresh loopback ports (new ones on every call, for the
    retry after a port clash); with a `standing` cluster, its servers' addresses too."""
    layout = plan_layout(plan, standing or {})
    workers = sum(member.job == "worker" for member in plan.members)
    return [
        Member(
            planned.name,
            planned.module,
            member_env(layout, planned, host_share(workers) if planned.job == "worker" else {}),
            server=planned.server,
            rejoins=planned.rejoins,
        )
        for planned in plan.members
    ]


def _is_peer_loss(error: str) -> bool:
    """A training error that means another member went away (TensorFlow's gRPC errors)."""
    return error.startswith(PEER_LOSS_ERRORS)


def _is_loss(returncode: int | None) -> bool:
    """Killed from outside (a kill, the OOM killer, a preemption), not a crash or an error."""
    return returncode is not None and -returncode in (signal.SIGKILL, signal.SIGTERM)


def _describe_exit(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with status {returncode}"
    signal_name = signal.Signals(-returncode).name
    if signal_name in ("SIGABRT", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE"):
        return f"crashed with {signal_name} (a native crash inside TensorFlow)"
    return f"was killed by {signal_name}"
