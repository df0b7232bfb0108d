"""Local OS processes: stopping a whole process tree, and knowing a recorded process again."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from stratoflow.distributed.processes import ManagedProcess, stop_tree

# A worker that, asked to stop, starts a helper in a session of its own (outside the process
# group) and keeps running: a killer that only looks at the tree and group once, before it
# signals, never sees the helper.
_WORKER = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    from pathlib import Path

    def start_helper(*_):
        helper = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
        )
        Path(sys.argv[1]).write_text(str(helper.pid))

    signal.signal(signal.SIGTERM, start_helper)
    Path(sys.argv[2]).write_text("ready")
    while True:
        time.sleep(0.1)
    """
)


def start_tree(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """A process group led by a server whose worker starts a helper when told to stop.

    Returns the server's Popen and the file the worker writes the helper's pid to.
    """
    helper_file, ready_file = tmp_path / "helper.pid", tmp_path / "ready"
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(120)",
            sys.executable,
            "-c",
            _WORKER,
            str(helper_file),
            str(ready_file),
        ],
        process_group=0,
    )
    deadline = time.monotonic() + 30
    while not ready_file.exists():
        assert time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.05)
    return server, helper_file


def alive_after(pids: list[int], seconds: float) -> list[int]:
    """Which of `pids` still run (zombies count as gone) after waiting up to `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        left = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    left.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_stopping_a_tree_also_stops_what_a_worker_started_while_shutting_down(
    tmp_path: Path,
) -> None:
    """A worker that ignores SIGTERM and starts a helper in its own session meanwhile: the
    grace's SIGKILL reaches the helper too (the tree is read again before killing)."""
    server, helper_file = start_tree(tmp_path)
    try:
        others = stop_tree(ManagedProcess.started(server), "server", grace_seconds=2.0)
        helper = int(helper_file.read_text())
        assert alive_after([server.pid, helper], 5) == []
        assert others == 2  # the worker and its helper
        assert server.returncode == -signal.SIGTERM  # the server itself stopped when asked
    finally:
        for pid in alive_after([int(helper_file.read_text())] if helper_file.exists() else [], 0):
            psutil.Process(pid).kill()


def test_a_stale_record_stops_nothing_when_its_pid_is_another_process_now() -> None:
    """`services down` after a reboot or a crash: the recorded PID may name an unrelated group
    leader by now. Neither it nor its group is touched."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], process_group=0)
    try:
        now = ManagedProcess.started(other)
        assert now.seconds_after_boot is not None  # Linux, as on the test hosts
        earlier = ManagedProcess(other.pid, now.create_time - 5, now.seconds_after_boot - 5)
        assert stop_tree(earlier, "stale record", grace_seconds=0.5) == 0
        time.sleep(0.5)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
