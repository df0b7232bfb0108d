"""A run's fixed cost: the CPU seconds of the whole process tree of `stratoflow run digits
--epochs 1` on prepared data, for well under a second of training.

`python -m benchmarks.fixed_cost` (in the benchmarks' throwaway state, as `make bench` calls it)
runs it once unmeasured (the dataset is prepared and the own-code check kept, as on any host
that ran the pipeline before), then `RUNS` times measured, and prints one JSON line: the median
run's CPU seconds (user + system of the CLI and every process it waited for, from the kernel's
accounting), its wall seconds, the CPU of each kind of process (sampled from /proc every 0.1 s:
a process's last tenth of a second may be missing) and the Airflow tasks' durations.
"""

from __future__ import annotations

import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

PIPELINE = "digits"
COMMAND = ["run", PIPELINE, "--epochs", "1"]
RUNS = 3
SAMPLE_SECONDS = 0.1
# Kinds of process, by what their command line runs (the first that matches).
KINDS = (
    ("own-code check", "stratoflow.training.own_code_check"),
    ("training process", "stratoflow.training.worker"),
    ("serving check", "stratoflow.tracking.serving_check"),
    ("Airflow metadata calls", "stratoflow.services.airflow_runs"),
    ("airflow dags test", "airflow dags test"),
    ("stratoflow CLI", "stratoflow run"),
)


def main() -> None:
    from benchmarks.throwaway import use_throwaway_state

    if "STRATOFLOW_HOME" not in os.environ:
        use_throwaway_state()
    _run_once()  # prepares the dataset, keeps the own-code check: not counted
    runs = [_run_once() for _ in range(RUNS)]
    median = sorted(runs, key=lambda run: run["cpu_seconds"])[len(runs) // 2]
    sys.stdout.write(
        json.dumps(
            {
                **median,
                "cpu_seconds_runs": [run["cpu_seconds"] for run in runs],
                "wall_seconds_median": statistics.median(run["wall_seconds"] for run in runs),
            }
        )
        + "\n"
    )


def _run_once() -> dict[str, Any]:
    executable = Path(sys.executable).with_name("stratoflow")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    process = subprocess.Popen(
        [str(executable), *COMMAND], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    sampled: dict[tuple[int, float], tuple[str, float]] = {}
    sampler = threading.Thread(target=_sample, args=(process, sampled), daemon=True)
    sampler.start()
    returncode = process.wait()
    wall = time.perf_counter() - started
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if returncode:
        raise RuntimeError(f"stratoflow {' '.join(COMMAND)} exited {returncode}")
    by_kind: dict[str, float] = {}
    for kind, cpu in sampled.values():
        by_kind[kind] = by_kind.get(kind, 0.0) + cpu
    return {
        "cpu_seconds": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "wall_seconds": wall,
        "cpu_by_process": {kind: round(cpu, 2) for kind, cpu in sorted(by_kind.items())},
        "task_seconds": _task_seconds(),
        "load_average_at_start": load,
    }


def _sample(process: subprocess.Popen[bytes], seen: dict[tuple[int, float], tuple[str, float]]):
    import psutil

    root = psutil.Process(process.pid)
    while process.poll() is None:
        try:
            members = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        for member in members:
            try:
                with member.oneshot():
                    times = member.cpu_times()
                    key = (member.pid, member.create_time())
                    # Asked every time: a process just forked shows its parent's command line
                    # until it execs, one exiting none.
                    kind = _kind(member.cmdline())
                    if kind == "other" and key in seen:
                        kind = seen[key][0]
                    seen[key] = (kind, times.user + times.system)
            except psutil.Error:
                continue
        time.sleep(SAMPLE_SECONDS)


def _kind(argv: list[str]) -> str:
    line = " ".join(argv)
    return next((kind for kind, marker in KINDS if marker in line), "other")


def _task_seconds() -> dict[str, float]:
    """The durations of the newest DAG run's tasks, from the Airflow metadata DB."""
    from stratoflow.config import names
    from stratoflow.services import airflow_setup

    dag_id = names.retrain_dag_id(PIPELINE)
    with sqlite3.connect(airflow_setup.airflow_home() / "airflow.db") as db:
        rows = db.execute(
            "SELECT task_id, duration FROM task_instance WHERE dag_id = ? AND run_id = "
            "(SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1)",
            (dag_id, dag_id),
        ).fetchall()
    return {task: round(seconds or 0.0, 2) for task, seconds in rows}


if __name__ == "__main__":
    main()
