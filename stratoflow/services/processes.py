"""Long-running server processes: is this PID still ours, stop a whole group, read its log.

A stack's processes outlive the command that started them, so they are remembered by PID and
start time (a PID alone may be reused by another process after a reboot or a crash). On Linux the
start time is counted from boot: a wall-clock step (NTP, a laptop or VM resuming) moves psutil's
`create_time` of every process, so a stack started before the step looked stopped after it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
# Two reads of one process's start after boot agree to the clock tick (10 ms).
SAME_START_SECONDS = 0.05


@dataclass
class ManagedProcess:
    """A server process: its PID and start time, and its Popen while the starter runs.

    `create_time` is psutil's (wall clock, seconds since the epoch); `seconds_after_boot` is the
    start counted from boot, where the system has it (Linux), which no clock step moves.
    """

    pid: int
    create_time: float
    seconds_after_boot: float | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @classmethod
    def started(cls, popen: subprocess.Popen[bytes]) -> ManagedProcess:
        return cls(popen.pid, _create_time(popen.pid), _seconds_after_boot(popen.pid), popen)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ManagedProcess:
        after_boot = data.get("seconds_after_boot")  # absent in a stack started before it was
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
            after_boot = _seconds_after_boot(self.pid)
            if self.seconds_after_boot is not None and after_boot is not None:
                return abs(after_boot - self.seconds_after_boot) < SAME_START_SECONDS
            return abs(candidate.create_time() - self.create_time) < 1.0
        except psutil.NoSuchProcess:
            return False


def terminate_group(process: ManagedProcess, name: str, grace_seconds: float) -> None:
    """SIGTERM the process, its group and its descendants; SIGKILL whatever outlives the grace."""
    import psutil

    members: list[psutil.Process] = []
    if process.is_alive():
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(process.pid)
            members = [root, *root.children(recursive=True)]
    members.extend(group_members(process.pid, exclude={m.pid for m in members}))
    for member in members:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.terminate()
    _gone, alive = psutil.wait_procs(members, timeout=grace_seconds)
    for member in alive:
        log.warning(
            "%s: pid %d ignored SIGTERM for %.0f s: killing", name, member.pid, grace_seconds
        )
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    psutil.wait_procs(alive, timeout=5)
    if process.popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.popen.wait(timeout=5)


def group_members(pgid: int, exclude: set[int]) -> Iterator[Any]:
    """Processes still in process group `pgid` (e.g. children orphaned by a killed leader)."""
    import psutil

    for candidate in psutil.process_iter():
        if candidate.pid in exclude:
            continue
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            if os.getpgid(candidate.pid) == pgid:
                yield candidate


def http_problem(url: str, check_body: Callable[[Any], str | None]) -> str | None:
    """Why `GET url` is not a healthy answer (no answer, not 200, or `check_body` objects)."""
    import httpx

    try:
        response = httpx.get(url, timeout=5.0)
    except httpx.HTTPError as error:
        return f"{type(error).__name__}: {error}"
    if response.status_code != 200:
        return f"HTTP {response.status_code} from {url}"
    try:
        body = response.json()
    except ValueError:
        body = response.text
    return check_body(body)


def write_private(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON readable by the owner only (created 0600, never world-readable meanwhile)."""
    write_private_text(path, json.dumps(data, indent=1))


def write_private_text(path: Path, text: str) -> None:
    """Write `text` readable by the owner only (created 0600, never world-readable meanwhile)."""
    temporary = path.with_suffix(".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as stream:
        stream.write(text)
    os.replace(temporary, path)


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log file, or "" if it cannot be read."""
    try:
        return last_lines(path.read_text(errors="replace"), lines)
    except OSError:
        return ""


def last_lines(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _seconds_after_boot(pid: int) -> float | None:
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
