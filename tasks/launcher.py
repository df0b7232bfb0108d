"""Runs TensorFlow programs in child processes and supervises them.

A native TensorFlow crash (an abort in a kernel) kills the process it happens in. Training in a
child turns it into a failed task with a clear message, instead of a dead Airflow worker or a DAG
run stuck in "running". This is the only module that starts or watches processes.
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
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

LOG_TAIL_LINES = 30
_PR_SET_PDEATHSIG = 1


class ChildProcessFailed(RuntimeError):
    """A child process exited non-zero or was killed; the message carries its last log lines."""


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

    Args:
        module: the module to run; it reads the payload file and writes the result file.
        payload: JSON-able input for the child.
        name: what to call the child in messages, e.g. "training process".
        env: extra environment variables for the child.
        timeout_seconds: kill the child and fail if it runs longer.

    Raises:
        ChildProcessFailed: non-zero exit, a signal, a timeout or no result; the message names
            the exit status and quotes the child's last log lines.
    """
    with tempfile.TemporaryDirectory(prefix="stratoflow-child-") as workdir:
        payload_path = Path(workdir) / "payload.json"
        result_path = Path(workdir) / "result.json"
        payload_path.write_text(json.dumps(payload))
        child_env = {**os.environ, **(env or {}), "STRATOFLOW_PROCESS_START": str(time.time())}
        process = subprocess.Popen(
            [sys.executable, "-m", module, str(payload_path), str(result_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            env=child_env,
            preexec_fn=_die_with_parent,
        )
        logger.info("%s started (pid %d): python -m %s", name, process.pid, module)
        tail = _stream_output(process, name, timeout_seconds)
        returncode = process.wait()
        result = json.loads(result_path.read_text()) if result_path.exists() else None
        if result is not None and "error" in result:
            raise ChildProcessFailed(f"{name} (pid {process.pid}) failed: {result['error']}")
        if returncode != 0:
            raise ChildProcessFailed(
                f"{name} (pid {process.pid}) {_describe_exit(returncode)}. "
                f"Last {len(tail)} lines of its log:\n" + "\n".join(tail)
            )
        if result is None:
            raise ChildProcessFailed(f"{name} (pid {process.pid}) exited 0 but wrote no result")
        return dict(result)


def _stream_output(
    process: subprocess.Popen[str], name: str, timeout_seconds: float | None
) -> collections.deque[str]:
    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
    deadline = time.monotonic() + timeout_seconds if timeout_seconds else None
    assert process.stdout is not None
    for line in process.stdout:
        line = line.rstrip()
        tail.append(line)
        logger.info("[%s] %s", name, line)
        if deadline and time.monotonic() > deadline:
            process.kill()
            raise ChildProcessFailed(f"{name} ran past its {timeout_seconds:.0f} s limit; killed")
    return tail


def _describe_exit(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with status {returncode}"
    signal_name = signal.Signals(-returncode).name
    if signal_name in ("SIGABRT", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE"):
        return f"crashed with {signal_name} (a native crash inside TensorFlow)"
    return f"was killed by {signal_name}"


def _die_with_parent() -> None:
    """In the child, before exec: get SIGKILL when the parent dies, so no orphan keeps training."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
