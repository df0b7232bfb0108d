"""`stratoflow services up`, `status` and `down`, each from its own process, as a user types them
in three shells: `up` returns with the stack running, another process reports it, a third stops
it and leaves no process of the stack behind (found by psutil, not by the stack's own records)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from stratoflow.services.config import COMPONENTS

pytestmark = pytest.mark.integration

STRATOFLOW = [sys.executable, "-m", "stratoflow.cli.main"]
TIMEOUT_S = 600


def stratoflow(*args: str) -> subprocess.CompletedProcess[str]:
    """One `stratoflow ...` command in a process of its own; returns once it exited."""
    return subprocess.run(
        [*STRATOFLOW, *args], capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )


def processes_of(state: Path) -> list[psutil.Process]:
    """Every live process whose command line or environment names the stack's folder."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid == os.getpid() or process.status() == psutil.STATUS_ZOMBIE:
                continue
            text = " ".join(process.cmdline()) + " ".join(process.environ().values())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if str(state) in text:
            found.append(process)
    return found


@pytest.fixture
def state() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="stratoflow-services-cli-")).resolve()
    try:
        yield folder
    finally:
        if processes_of(folder):  # the test failed before `down`: stop what it started
            stratoflow("services", "down", "--state-dir", str(folder))
        shutil.rmtree(folder, ignore_errors=True)


def test_services_up_status_down_from_separate_processes(state: Path) -> None:
    up = stratoflow("services", "up", "--state-dir", str(state))
    assert up.returncode == 0, up.stderr[-3000:]
    assert f"stack in {state}: {len(COMPONENTS)}/{len(COMPONENTS)} components running" in up.stdout
    # `up` has exited; the stack outlives it.
    running = processes_of(state)
    assert len(running) >= len(COMPONENTS), [p.cmdline()[:3] for p in running]
    assert all(p.is_running() for p in running)

    status = stratoflow("services", "status", "--state-dir", str(state))
    assert status.returncode == 0, status.stderr[-3000:]
    assert (
        f"stack in {state}: {len(COMPONENTS)}/{len(COMPONENTS)} components running" in status.stdout
    )
    (mlflow_uri,) = re.findall(r"MLflow tracking server:\s+(\S+)", status.stdout)
    with urllib.request.urlopen(f"{mlflow_uri}/health", timeout=10) as response:
        assert response.status == 200

    down = stratoflow("services", "down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr[-3000:]
    assert f"stack in {state} stopped" in down.stdout
    _, alive = psutil.wait_procs(running, timeout=5)
    assert [p.cmdline()[:3] for p in alive] == []
    assert processes_of(state) == []

    after = stratoflow("services", "status", "--state-dir", str(state))
    assert after.returncode == 0, after.stderr[-3000:]
    assert f"stack in {state}: 0/{len(COMPONENTS)} components running" in after.stdout
