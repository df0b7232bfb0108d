"""Local OS processes: is a PID still the process started, stop a whole tree, die with the parent.

The one place the CLI (`stratoflow run`, `serve-model`), the services stack and the launchers
handle processes they started. A process is known again by its PID and its start (a PID alone
may be reused by another process after a reboot or a crash). On Linux the start is counted from
boot: a wall-clock step (NTP, a laptop or VM resuming) moves psutil's `create_time` of every
process, so a process started before the step would look gone after it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Two reads of one process's start after boot agree to the clock tick (10 ms).
SAME_START_SECONDS = 0.05
# How long to wait for killed processes to be gone (SIGKILL cannot be ignored; reaping can lag).
KILLED_WAIT_SECONDS = 10.0
_PR_SET_PDEATHSIG = 1


@dataclass
class ManagedProcess:
    """A started process: its PID and start time, and its Popen while the starter runs.

    `create_time` is psutil's (wall clock, seconds since the epoch); `seconds_after_boot` is the
    start counted from boot, where the system has it (Linux), which no clock step moves.
    """

    pid: int
    create_time: float
    seconds_after_boot: float | None = None
    popen: subprocess.Popen[Any] | None = field(default=None, repr=False)

    @classmethod
    def started(cls, popen: subprocess.Popen[Any]) -> ManagedProcess:
        """The record of a process this one just started."""
        return cls(popen.pid, _create_time(popen.pid), seconds_after_boot(popen.pid), popen)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ManagedProcess:
        """A record written by `to_dict` (perhaps by another process, before a clock step)."""
        after_boot = data.get("seconds_after_boot")  # absent in a record written before it was
        return cls(
            int(data["pid"]),
            float(data["create_time"]),
            None if after_boot is None else float(after_boot),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "create_time": self.create_time,
            "seconds_after_boot": self.seconds_after_boot,
        }

    def is_alive(self) -> bool:
        """The PID is alive and is still the process started (not a later one reusing it)."""
        import psutil

        if self.popen is not None:
            return self.popen.poll() is None
        try:
            candidate = psutil.Process(self.pid)
            if candidate.status() == psutil.STATUS_ZOMBIE:
                return False
            after_boot = seconds_after_boot(self.pid)
            if self.seconds_after_boot is not None and after_boot is not None:
                return abs(after_boot - self.seconds_after_boot) < SAME_START_SECONDS
            return abs(candidate.create_time() - self.create_time) < 1.0
        except psutil.NoSuchProcess:
            return False


def stop_tree(process: ManagedProcess, name: str, grace_seconds: float = 0) -> int:
    """Stop `process`, its descendants and its process group; return how many others it stopped.

    With `grace_seconds`, each gets SIGTERM first and that long to end by itself (a server's
    clean shutdown); whatever is left then, including processes started meanwhile (a worker
    may start a helper while it shuts down, in a session of its own), gets SIGKILL. Without it,
    SIGKILL at once. The tree is read from `process` only while it is still the process started
    (`is_alive`); its group is found by process group id (children orphaned by a killed leader).
    """
    import psutil

    if grace_seconds:
        members = _tree(process)
        for member in members:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.send_signal(signal.SIGTERM)
        _wait_gone(process, members, grace_seconds)
    # Read again: what ignored SIGTERM may have started others meanwhile.
    members = _tree(process)
    for member in members:
        with contextlib.suppress(psutil.NoSuchProcess):
            if grace_seconds and member.status() != psutil.STATUS_ZOMBIE:
                log.warning("%s: pid %d outlived SIGTERM: killing", name, member.pid)
            member.kill()
    _wait_gone(process, members, KILLED_WAIT_SECONDS)
    return len({m.pid for m in members if m.pid != process.pid})


def _tree(process: ManagedProcess) -> list[Any]:
    """The process (while it is the one started), every descendant of it and of its group."""
    import psutil

    members: dict[int, psutil.Process] = {}
    roots: list[psutil.Process] = []
    if process.is_alive():
        with contextlib.suppress(psutil.NoSuchProcess):
            roots.append(psutil.Process(process.pid))
    elif _runs(process.pid):
        # Another process has its PID now. Linux reuses no PID still naming a process group,
        # so nothing of the old group is left, and the new process's group is not ours.
        return []
    roots.extend(group_members(process.pid, exclude={r.pid for r in roots}))
    for root in roots:
        members[root.pid] = root
        with contextlib.suppress(psutil.NoSuchProcess):
            members.update((c.pid, c) for c in root.children(recursive=True))
    return list(members.values())


def _runs(pid: int) -> bool:
    """Some process that is not a zombie has PID `pid`."""
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _wait_gone(process: ManagedProcess, members: list[Any], seconds: float) -> None:
    """Wait up to `seconds` for `members` to end; the Popen reaps its own child."""
    import psutil

    if process.popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.popen.wait(seconds)
    others = [m for m in members if process.popen is None or m.pid != process.pid]
    psutil.wait_procs(others, timeout=seconds)


def group_members(pgid: int, exclude: set[int]) -> Iterator[Any]:
    """Processes still in process group `pgid` (e.g. children orphaned by a killed leader)."""
    import psutil

    for candidate in psutil.process_iter():
        if candidate.pid in exclude:
            continue
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            if os.getpgid(candidate.pid) == pgid:
                yield candidate


def die_with_parent(signum: int) -> Callable[[], None]:
    """A `preexec_fn` giving the child signal `signum` when its starter dies, so no orphan is left.

    libc is loaded here, in the parent: the child may already run as another OS user that cannot
    read this interpreter's files.
    """
    libc = ctypes.CDLL("libc.so.6", use_errno=True)

    def set_parent_death_signal() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signum)

    return set_parent_death_signal


def seconds_after_boot(pid: int) -> float | None:
    """When `pid` started, in seconds after boot (`starttime` of /proc/PID/stat); None elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name, which is in parentheses and may hold spaces: state is the
    # 3rd field of the file, starttime the 22nd.
    start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
    return start_ticks / os.sysconf("SC_CLK_TCK")


def _create_time(pid: int) -> float:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.NoSuchProcess:
        return 0.0


def start_reading_lines(
    command: list[str],
    env: Mapping[str, str],
    on_line: Callable[[str], None],
    stdin: int = subprocess.DEVNULL,
) -> tuple[subprocess.Popen[str], threading.Thread]:
    """Start `command` as a child that dies with its starter (SIGKILL), its output (stdout and
    stderr) handed line by line to `on_line` by a daemon thread; the child and the thread."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=stdin,
        text=True,
        bufsize=1,
        env=dict(env),
        preexec_fn=die_with_parent(signal.SIGKILL),
    )

    def read() -> None:
        assert process.stdout is not None
        for raw in process.stdout:
            on_line(raw.rstrip())

    reader = threading.Thread(target=read, daemon=True, name=f"output-of-{process.pid}")
    reader.start()
    return process, reader
