"""`make bench`: stratoflow against its baselines, side by side in one invocation.

Runs every comparison on the mnist pipeline's model and data, repeats, and writes the medians
and ratios to `docs/benchmarks.json` and `docs/BENCHMARKS.md` (with the machine description and
the targets met or missed). Figures, not timed tests: the ratios compare runs made minutes apart
on the same machine, so shared-machine noise mostly cancels.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks import airflow_floor
from benchmarks.in_process import STREAM_BATCH
from benchmarks.throwaway import use_throwaway_state
from stratoflow.config import locations, names
from stratoflow.services import airflow_setup

logger = logging.getLogger("benchmarks")

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CLUSTER_REPEATS = 2
CLUSTER_EPOCHS = 3  # the first epoch (tracing, cluster warm-up) is not counted

# The orchestration overhead less what `dags test` of a DAG of empty tasks spends outside them.
BEYOND_FLOOR = "orchestration overhead beyond Airflow's own (empty tasks) / wall time"
# How many times that empty DAG is run (its median counts).
FLOOR_RUNS = 3
FIXED_COST = "fixed cost: CPU of `stratoflow run digits --epochs 1` (s)"
# `benchmarks.recovery`: seconds from a killed worker to training again, local launcher.
RECOVERY = "recovery after a killed worker, {case}, {spares} (s)"
RECOVERY_TARGETS = {"multi_worker_mirrored": 5.0, "parameter_server": 3.0}
# The bundled pipelines whose statistics cost is measured (`benchmarks.statistics_cost`).
STATISTICS_PIPELINES = ("mnist", "digits", "penguins", "diabetes")
TARGETS = {
    "training step vs bare Keras fit": (">=", 0.97),
    "mirrored(2) vs one_device": ("report", None),
    "multi_worker_mirrored(2) vs single process, same threads": (">=", 0.85),
    "parameter_server vs one_device": ("report", None),
    "real input vs synthetic tensors": (">=", 0.97),
    "XLA-compiled fit vs plain fit": ("report", None),
    "MLflow logging per epoch / epoch time (server)": ("report", None),
    "orchestration overhead / wall time": ("<=", 0.10),
    BEYOND_FLOOR: ("report", None),
    FIXED_COST: ("<=", 20.0),
    "peak RSS of a training process (MB)": ("<=", 1536.0),
    "MFU (training FLOP/s / matmul FLOP/s)": (">=", 0.30),
    "larger than memory: streamed input vs synthetic tensors": (">=", 0.95),
    "larger than memory: peak RSS of the training process (MB)": ("<=", 1536.0),
    **{
        RECOVERY.format(case=case, spares=spares): ("<=", bound)
        if spares == "warm spares"
        else ("report", None)
        for case, bound in RECOVERY_TARGETS.items()
        for spares in ("no spares", "warm spares")
    },
    "launcher ray vs local, multi_worker_mirrored(2) throughput": (">=", 0.95),
    "launcher ray vs local, parameter_server throughput": (">=", 0.95),
    **{
        f"statistics of every split / training, {pipeline}": ("report", None)
        for pipeline in STATISTICS_PIPELINES
    },
}
# The larger-than-memory case: the cache budget it trains with (MiB); its generated dataset
# (benchmarks/generated_data, config `bench`) decodes to more than 4x this.
STREAMING_BUDGET_MIB = 128


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if sys.argv[1:]:
        _only(sys.argv[1:])
        return
    started = time.perf_counter()
    load_before = os.getloadavg()
    home = use_throwaway_state()
    figures: dict[str, Any] = {}
    logger.info("in-process benchmarks (one logical CPU, then two)")
    figures["single"] = _in_process("single")
    figures["mirrored"] = _in_process("mirrored")
    logger.info("larger than memory: a generated dataset streamed vs synthetic tensors")
    figures["streaming"] = _streaming()
    logger.info("training-process runs: one_device, multi_worker_mirrored, parameter_server")
    figures["cluster"] = _cluster_runs()
    logger.info("MLflow epoch logging: local store, then a tracking server")
    figures["epoch_logging"] = _epoch_logging(home)
    logger.info("a whole DAG run through Airflow")
    figures["orchestration"] = _orchestration()
    logger.info("a run's fixed cost: the process tree of a 1-epoch digits run")
    figures["fixed_cost"] = _fixed_cost()
    logger.info("recovery from a killed worker, with and without warm spares")
    figures["recovery"] = _recovery()
    logger.info("statistics of every split against training, on the bundled pipelines")
    figures["statistics"] = _statistics_cost()
    logger.info("the ray launcher against local, on hosts made of network namespaces")
    figures["ray"] = _ray()
    figures["bench_seconds"] = time.perf_counter() - started
    figures["load_average"] = {"before": load_before, "after": os.getloadavg()}
    figures["written"] = time.strftime("%Y-%m-%d")
    figures["machine"] = _machine()
    previous = _previous_run()
    figures["previous_run"] = previous["about"]
    rows = _rows(figures, previous["values"])
    DOCS.mkdir(exist_ok=True)
    (DOCS / "benchmarks.json").write_text(json.dumps({"figures": figures, "rows": rows}, indent=1))
    (DOCS / "BENCHMARKS.md").write_text(_markdown(figures, rows) + _hand_written())
    sys.stdout.write(_table(rows) + f"\nwritten: {DOCS / 'BENCHMARKS.md'}\n")


# The parts `python -m benchmarks.run PART ...` runs alone (figures printed, docs not written).
PARTS = ("orchestration", "fixed_cost", "recovery")


def _only(parts: list[str]) -> None:
    """Run only the named parts in a throwaway state and print their figures (JSON)."""
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise SystemExit(f"unknown part(s) {unknown}; parts: {', '.join(PARTS)}")
    use_throwaway_state()
    figures: dict[str, Any] = {"load_average_before": os.getloadavg()}
    if "orchestration" in parts:
        figures["orchestration"] = orchestration = _orchestration()
        tasks_total = sum(orchestration["task_seconds"].values())
        wall = orchestration["wall_seconds"]
        figures["orchestration overhead / wall time"] = (wall - tasks_total) / wall
        figures[BEYOND_FLOOR] = _beyond_floor(orchestration)
    if "fixed_cost" in parts:
        figures["fixed_cost"] = _fixed_cost()
    if "recovery" in parts:
        figures["recovery"] = _recovery()
    figures["load_average_after"] = os.getloadavg()
    sys.stdout.write(json.dumps(figures, indent=1) + "\n")


def _fixed_cost() -> dict[str, Any]:
    """`benchmarks.fixed_cost` in its own process (this process's state folder)."""
    output = subprocess.run(
        [sys.executable, "-m", "benchmarks.fixed_cost"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    return dict(json.loads(output.strip().splitlines()[-1]))


def _recovery() -> dict[str, Any]:
    """`benchmarks.recovery` in its own process (this process's state folder)."""
    output = subprocess.run(
        [sys.executable, "-m", "benchmarks.recovery"],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    return dict(json.loads(output.strip().splitlines()[-1]))


def _in_process(mode: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    output = subprocess.run(
        [sys.executable, "-m", "benchmarks.in_process", mode, *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    ).stdout
    return dict(json.loads(output.strip().splitlines()[-1]))


def _statistics_cost() -> dict[str, Any]:
    """Each bundled pipeline's statistics time against its default training's, one process."""
    output = subprocess.run(
        [sys.executable, "-m", "benchmarks.statistics_cost", *STATISTICS_PIPELINES],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    return {line["pipeline"]: line for line in lines}


def _streaming() -> dict[str, Any]:
    """Generate the larger-than-memory dataset into a temporary data dir, train on it, remove it.

    Generated in its own process, so the training process's peak RSS is training's alone.
    """
    data_dir = Path(tempfile.mkdtemp(prefix="stratoflow-bench-data-"))
    try:
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "benchmarks.generated_data", str(data_dir), "bench"],
            capture_output=True,
            check=True,
            cwd=ROOT,
        )
        generate_seconds = time.perf_counter() - started
        disk_bytes = sum(path.stat().st_size for path in data_dir.rglob("*") if path.is_file())
        figures = _in_process(
            "streaming",
            str(STREAMING_BUDGET_MIB),
            env={locations.DATA_DIR_ENV: str(data_dir)},
        )
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    if figures["cached"] or figures["decoded_mib"] < 4 * STREAMING_BUDGET_MIB:
        raise RuntimeError(
            f"the larger-than-memory case must stream a split of at least 4x its budget: "
            f"{figures['decoded_mib']:.0f} MiB decoded, budget {STREAMING_BUDGET_MIB} MiB, "
            f"cached: {figures['cached']}"
        )
    return {**figures, "generate_seconds": generate_seconds, "disk_mib": disk_bytes / 2**20}


def _cluster_runs(only: tuple[str, ...] = ()) -> dict[str, Any]:
    from stratoflow.tasks import prepare, train
    from stratoflow.tasks.run_context import AirflowRun
    from stratoflow.tracking import mlflow_runs

    cores = str(os.cpu_count() or 1)
    variants: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
        # Same total threads: one process with an intra-op thread per core vs 2 workers that
        # split the cores (the launcher gives each local worker its share: 1 thread here).
        "one_device": ({"strategy": "one_device"}, {"TF_NUM_INTRAOP_THREADS": cores}),
        "multi_worker_mirrored": ({"strategy": "multi_worker_mirrored", "workers": 2}, {}),
        "parameter_server": ({"strategy": "parameter_server", "workers": 2, "ps": 1}, {}),
    }
    if only:
        variants = {name: variants[name] for name in only}
    figures: dict[str, Any] = {name: [] for name in variants}
    for _ in range(CLUSTER_REPEATS):
        for name, (params, env) in variants.items():
            params = {**params, "epochs": CLUSTER_EPOCHS}
            run = AirflowRun("retrain_mnist", f"bench__{uuid.uuid4().hex[:8]}")
            saved = {key: os.environ.get(key) for key in env}
            os.environ.update(env)
            try:
                prepared = prepare.prepare("mnist", params, run)
                started = time.perf_counter()
                trained = train.train(run, prepared)
                wall = time.perf_counter() - started
            finally:
                for key, value in saved.items():
                    os.environ.pop(key, None) if value is None else os.environ.update({key: value})
            client = mlflow_runs.client()
            rates = sorted(
                client.get_metric_history(trained.mlflow_run_id, "examples_per_second"),
                key=lambda m: m.step,
            )
            metrics = client.get_run(trained.mlflow_run_id).data.metrics
            figures[name].append(
                {
                    "examples_per_second": statistics.median(m.value for m in rates[1:]),
                    "task_wall_seconds": wall,
                    "seconds_to_first_step": metrics.get("seconds_to_first_step"),
                    "peak_rss_mb": metrics.get("peak_rss_mb"),
                }
            )
    return {
        name: {
            key: statistics.median(run[key] for run in runs if run[key] is not None)
            for key in runs[0]
        }
        for name, runs in figures.items()
    }


def _ray() -> dict[str, Any]:
    from benchmarks import ray_launcher

    return ray_launcher.measure()


def _epoch_logging(home: Path) -> dict[str, float]:
    """Median seconds of one epoch's metrics reaching MLflow
    (`stratoflow.tracking.mlflow_runs.EpochLogger`).

    The training process makes this call between two epochs (never inside a step); the figure
    says what that pause costs, on the local SQLite store and through an MLflow server.
    """
    from stratoflow.distributed.cluster import free_ports
    from stratoflow.tracking import mlflow_runs

    local_uri = locations.tracking_uri()
    seconds = {"sqlite": _time_epoch_logger(local_uri)}
    port = free_ports(1)[0]
    server = subprocess.Popen(
        [
            sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
            "--workers", "1", "--backend-store-uri", f"sqlite:///{home / 'server.db'}",
        ],
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        uri = f"http://127.0.0.1:{port}"
        mlflow_runs.check_reachable(uri, attempts=30)
        seconds["server"] = _time_epoch_logger(uri)
    finally:
        server.terminate()
        server.wait(timeout=30)
        # MLflow's set_tracking_uri also sets $MLFLOW_TRACKING_URI, which the DAG run inherits.
        os.environ[locations.TRACKING_URI_ENV] = local_uri
        mlflow_runs.client(local_uri)
    return seconds


def _time_epoch_logger(tracking_uri: str, epochs: int = 20) -> float:
    from stratoflow.tracking import mlflow_runs

    mlflow_client = mlflow_runs.client(tracking_uri)
    run_id = mlflow_client.create_run("0").info.run_id
    log_epoch = mlflow_runs.EpochLogger(tracking_uri, run_id)
    durations = []
    for epoch in range(1, epochs + 1):
        started = time.perf_counter()
        log_epoch({"epoch": epoch, **{key: 0.5 for key in names.EPOCH_METRICS}})
        durations.append(time.perf_counter() - started)
    return statistics.median(durations)


def _orchestration() -> dict[str, Any]:
    from stratoflow.cli import runner
    from stratoflow.tracking import mlflow_runs, reports

    home = airflow_setup.airflow_home()
    env = airflow_setup.airflow_env(home)
    airflow_setup.ensure_airflow_db(home, env)  # one-off set-up, not per run
    # What `make run` does (runner.run_pipeline), with the `airflow dags test` process timed alone.
    started = time.perf_counter()
    runner.check_conf("mnist", {})
    dags_test_started = time.perf_counter()
    # Raises if the DAG run failed.
    run_id = runner.dags_test(names.retrain_dag_id("mnist"), {}, home, env)
    dags_test_wall = time.perf_counter() - dags_test_started
    summary = reports.describe_dag_run("mnist", "retrain_mnist", run_id)
    sys.stdout.write(runner.format_summary("mnist", run_id, summary))
    wall = time.perf_counter() - started
    metrics = mlflow_runs.client().get_run(summary["mlflow_run_id"]).data.metrics
    tasks = airflow_floor.task_durations(home, names.retrain_dag_id("mnist"))
    floors = [airflow_floor.measure(home, env, len(tasks)) for _ in range(FLOOR_RUNS)]
    return {
        "wall_seconds": dags_test_wall,
        "make_run_seconds": wall,
        "task_seconds": tasks,
        # Airflow's own seconds outside the tasks, one figure per empty-DAG run.
        "airflow_floor_seconds": [
            floor["wall_seconds"] - sum(floor["task_seconds"].values()) for floor in floors
        ],
        "train_seconds": metrics.get("train_seconds"),
        "seconds_to_first_step": metrics.get("seconds_to_first_step"),
        "peak_rss_mb": metrics.get("peak_rss_mb"),
        "test_accuracy": metrics.get("test_accuracy"),
    }


def _beyond_floor(orchestration: dict[str, Any]) -> float:
    """The run's seconds outside its tasks less Airflow's floor (the empty DAG's median), over
    the run's wall time."""
    outside = orchestration["wall_seconds"] - sum(orchestration["task_seconds"].values())
    floor = statistics.median(orchestration["airflow_floor_seconds"])
    return (outside - floor) / orchestration["wall_seconds"]


def _rows(figures: dict[str, Any], previous: dict[str, float]) -> list[dict[str, Any]]:
    from benchmarks import ray_launcher

    single, mirrored = figures["single"], figures["mirrored"]
    cluster, orchestration = figures["cluster"], figures["orchestration"]
    tasks_total = sum(orchestration["task_seconds"].values())
    peak_rss = max(
        value
        for value in [
            orchestration["peak_rss_mb"],
            *(run["peak_rss_mb"] for run in cluster.values()),
        ]
        if value
    )
    one_device = cluster["one_device"]["examples_per_second"]
    # name: (value from wall-clock time, the same ratio from CPU time where measured)
    ratios: dict[str, tuple[float, float | None]] = {
        "training step vs bare Keras fit": (
            single["stratoflow_vs_keras_fit"],
            single["cpu_time"]["stratoflow_vs_keras_fit"],
        ),
        "mirrored(2) vs one_device": (
            mirrored["mirrored_vs_one_device"],
            mirrored["cpu_time"]["mirrored_vs_one_device"],
        ),
        "multi_worker_mirrored(2) vs single process, same threads": (
            cluster["multi_worker_mirrored"]["examples_per_second"] / one_device,
            None,
        ),
        "parameter_server vs one_device": (
            cluster["parameter_server"]["examples_per_second"] / one_device,
            None,
        ),
        "real input vs synthetic tensors": (
            single["real_vs_synthetic_input"],
            single["cpu_time"]["real_vs_synthetic_input"],
        ),
        "XLA-compiled fit vs plain fit": (
            single["xla_vs_keras_fit"],
            single["cpu_time"]["xla_vs_keras_fit"],
        ),
        "MLflow logging per epoch / epoch time (server)": (
            figures["epoch_logging"]["server"] / _epoch_seconds(single),
            None,
        ),
        "orchestration overhead / wall time": (
            (orchestration["wall_seconds"] - tasks_total) / orchestration["wall_seconds"],
            None,
        ),
        BEYOND_FLOOR: (_beyond_floor(orchestration), None),
        FIXED_COST: (figures["fixed_cost"]["cpu_seconds"], None),
        "peak RSS of a training process (MB)": (peak_rss, None),
        "MFU (training FLOP/s / matmul FLOP/s)": (single["mfu"], single["cpu_time"]["mfu"]),
        "larger than memory: streamed input vs synthetic tensors": (
            figures["streaming"]["streamed_vs_synthetic"],
            figures["streaming"]["cpu_time"]["streamed_vs_synthetic"],
        ),
        "larger than memory: peak RSS of the training process (MB)": (
            figures["streaming"]["peak_rss_mb"],
            None,
        ),
        **{
            RECOVERY.format(case=key.split("/")[0], spares=key.split("/")[1]): (seconds, None)
            for key, seconds in figures["recovery"]["median_recovery_seconds"].items()
        },
        **{
            # The median of `ray_launcher.THROUGHPUT_PAIRS` pairs.
            f"launcher ray vs local, {label} throughput": (
                statistics.median(ray_launcher.throughput_ratios(figures["ray"], name)),
                None,
            )
            for name, label in (
                ("multi_worker_mirrored", "multi_worker_mirrored(2)"),
                ("parameter_server", "parameter_server"),
            )
        },
        **{
            f"statistics of every split / training, {pipeline}": (
                figures["statistics"][pipeline]["share_of_training"],
                None,
            )
            for pipeline in STATISTICS_PIPELINES
        },
    }
    rows = []
    for name, (value, cpu_value) in ratios.items():
        op, bound = TARGETS[name]
        verdict = (
            "-"
            if bound is None
            else ("pass" if (value >= bound if op == ">=" else value <= bound) else "miss")
        )
        rows.append(
            {
                "comparison": name,
                "value": value,
                "cpu_time_value": cpu_value,
                "previous": previous.get(name),
                "target": f"{op} {bound}" if bound else "-",
                "verdict": verdict,
            }
        )
    return rows


# docs/BENCHMARKS.md below this line is written by hand (figures the tests measure, facts the code
# relies on): `make bench` rewrites what is above it and keeps the rest.
HAND_WRITTEN_MARKER = "<!-- Written by hand below: `make bench` keeps what follows. -->"


def _hand_written() -> str:
    """The hand-written part of docs/BENCHMARKS.md, marker included ("" when there is none)."""
    path = DOCS / "BENCHMARKS.md"
    text = path.read_text() if path.is_file() else ""
    at = text.find(HAND_WRITTEN_MARKER)
    return "\n" + text[at:] if at >= 0 else ""


def _streaming_figures(streaming: dict[str, Any]) -> str:
    return (
        "- larger than memory (`stratoflow_generated/bench`, generated in "
        f"{streaming['generate_seconds']:.0f} s: {streaming['train_examples']:,} training "
        f"examples of 32x32x3 float32, {streaming['decoded_mib']:.0f} MiB decoded, "
        f"{streaming['disk_mib']:.0f} MiB of files on disk, {streaming['files']} training "
        f"files; cache budget {streaming['budget_mib']} MiB, so streamed, shuffle buffer "
        f"{streaming['shuffle_buffer']:,} examples): small_cnn, one_device, batch "
        f"{STREAM_BATCH}, one pass in turns of windows ({streaming['rounds']} kept): streamed "
        f"{streaming['streamed_examples_per_second']:.0f} examples/s, synthetic tensors of the "
        f"same shape {streaming['synthetic_examples_per_second']:.0f}; the training process's "
        f"peak RSS {streaming['peak_rss_mb']:.0f} MB"
    )


def _epoch_seconds(single: dict[str, Any]) -> float:
    """Seconds of one epoch of the custom loop (one_device), from its median rate."""
    return float(single["examples_per_epoch"] / single["stratoflow_examples_per_second"])


def _previous_run() -> dict[str, Any]:
    """The last `make bench` (docs/benchmarks.json and .md): its values, date and machine."""
    path = DOCS / "benchmarks.json"
    if not path.is_file():
        return {"values": {}, "about": "none"}
    saved = json.loads(path.read_text())
    header = (DOCS / "BENCHMARKS.md").read_text() if (DOCS / "BENCHMARKS.md").is_file() else ""
    lines = {line.split(" ", 1)[0]: line for line in header.splitlines() if line}
    written = saved["figures"].get("written") or lines.get("Written", "").split(" on ")[-1][:10]
    machine = saved["figures"].get("machine") or lines.get("Machine:", "Machine: ?")[9:]
    return {
        "values": {row["comparison"]: row["value"] for row in saved["rows"]},
        "about": f"{written}, on {machine.split(',')[0].strip().rstrip('.')}",
    }


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'comparison':<58} {'value':>9} {'cpu':>7} {'target':>9}  verdict"]
    lines += [
        f"{r['comparison']:<58} {r['value']:>9.3f} {_number(r['cpu_time_value']):>7} "
        f"{r['target']:>9}  {r['verdict']}"
        for r in rows
    ]
    return "\n".join(lines)


def _machine() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    memory_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    from importlib.metadata import version

    from stratoflow.tracking.environment import tensorflow_distribution

    tensorflow = tensorflow_distribution()  # tensorflow-cpu, or tensorflow on a gpu install
    return (
        f"{model}, {os.cpu_count()} cores, {memory_kb / 2**20:.0f} GiB, no GPU; Python "
        f"{platform.python_version()}, {tensorflow} {version(tensorflow)}, keras "
        f"{version('keras')}, apache-airflow {version('apache-airflow')}, "
        f"mlflow {version('mlflow')}"
    )


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _fixed_cost_line(fixed: dict[str, Any]) -> str:
    by_process = fixed["cpu_by_process"]
    return (
        f"- a run's fixed cost (`stratoflow run digits --epochs 1`, data prepared and the "
        f"own-code check kept; median of {len(fixed['cpu_seconds_runs'])}: "
        + ", ".join(f"{value:.1f}" for value in fixed["cpu_seconds_runs"])
        + f" s): {fixed['cpu_seconds']:.1f} s of CPU for the process tree, "
        f"{fixed['wall_seconds']:.1f} s of wall clock; by process (sampled): "
        + ", ".join(f"{kind} {cpu:.1f} s" for kind, cpu in by_process.items())
        + "; tasks: "
        + ", ".join(f"{task} {seconds:.1f} s" for task, seconds in fixed["task_seconds"].items())
    )


def _ray_lines(ray: dict[str, Any]) -> list[str]:
    """The Ray section's lines (`benchmarks.ray_launcher.measure`'s figures)."""
    from benchmarks.ray_launcher import RECOVERY_EPOCHS, THROUGHPUT_PAIRS, throughput_ratios

    def recovery(key: str) -> str:
        run = ray[key]
        if "error" in run:
            return f"failed {run['failed_at'] - run['killed_at']:.0f} s after the kill"
        seconds = ", ".join(f"{value:.1f}" for value in run["recovery_seconds"]) or "none"
        return f"training again after {seconds} s ({run['restarts']:.0f} restart(s))"

    lines = [
        "",
        "## The ray launcher",
        "",
        "A Ray head and two Ray nodes in network namespaces on this machine "
        f"(`tests/support/ray_hosts.py`): up in {ray['ray_start_seconds']:.0f} s, "
        f"{ray['ray_processes']} processes, {ray['ray_memory_mb']:.0f} MB RSS idle (Ray's own "
        f"processes, summed). Each run: the training task's body on the head host, "
        f"{CLUSTER_EPOCHS} epochs of mnist ({RECOVERY_EPOCHS} for a recovery), throughput the "
        f"median of the epochs after the first. The throughput runs are {THROUGHPUT_PAIRS} pairs "
        "(local, then ray) per strategy; the table's ratio is the median of the pairs' (below: "
        "each pair's, and the first pair's runs).",
        "",
    ]
    for name in ("multi_worker_mirrored", "parameter_server"):
        lines.append(
            f"- {name}, ray/local pair by pair: "
            + ", ".join(f"{ratio:.3f}" for ratio in throughput_ratios(ray, name))
        )
    for name in ("multi_worker_mirrored", "parameter_server"):
        local, on_ray = ray[f"{name}/local"], ray[f"{name}/ray"]
        lines.append(
            f"- {name}: local {local['examples_per_second']:.0f} examples/s, first step after "
            f"{local['seconds_to_first_step']:.1f} s, task {local['task_wall_seconds']:.0f} s; "
            f"ray {on_ray['examples_per_second']:.0f} examples/s, first step after "
            f"{on_ray['seconds_to_first_step']:.1f} s, task {on_ray['task_wall_seconds']:.0f} s"
        )
        lines.append(
            f"- {name}, worker 1 killed after the first checkpoint: local "
            f"{recovery(f'{name}/local/worker killed')}; ray "
            f"{recovery(f'{name}/ray/worker killed')}, with warm spares "
            f"{recovery(f'{name}/ray/worker killed, warm spares')}; its whole host killed "
            f"(ray): {recovery(f'{name}/ray/host killed')}, with warm spares "
            f"{recovery(f'{name}/ray/host killed, warm spares')}"
        )
    head = ray["multi_worker_mirrored/ray/head killed"]
    outcome = (
        f"the task failed {head['failed_at'] - head['killed_at']:.0f} s after the kill: "
        + head["error"].splitlines()[0][:300]
        if "error" in head
        else "the run finished anyway"
    )
    lines.append(f"- the Ray head's processes killed mid-run (multi_worker_mirrored): {outcome}")
    return lines


def _markdown(figures: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    single, mirrored = figures["single"], figures["mirrored"]
    cluster, orchestration = figures["cluster"], figures["orchestration"]
    table = [
        "| comparison | value | CPU-time ratio | previous run | target | verdict |",
        "|---|---|---|---|---|---|",
    ]
    table += [
        f"| {r['comparison']} | {r['value']:.3f} | {_number(r['cpu_time_value'])} | "
        f"{_number(r['previous'])} | {r['target']} | {r['verdict']} |"
        for r in rows
    ]
    before, after = figures["load_average"]["before"], figures["load_average"]["after"]
    cores = os.cpu_count() or 1
    # The load when the bench starts: during and after, its own processes are most of the load.
    shared = before[0] > 0.5 * cores
    params = 225_034  # small_cnn: conv 320 + 18,496, dense 204,928 + 1,290
    batch = 64
    step_seconds = batch / single["stratoflow_examples_per_second"]
    gradient_mb = params * 4 / 1e6
    allreduce_ms = 2 * gradient_mb / 1.2
    tasks_total = sum(orchestration["task_seconds"].values())
    return "\n".join(
        [
            "# Benchmarks",
            "",
            f"Written by `make bench` on {time.strftime('%Y-%m-%d')} in "
            f"{figures['bench_seconds']:.0f} s.",
            f"Machine: {_machine()}.",
            f"Load average (1, 5, 15 min) before: {before[0]:.2f}, {before[1]:.2f}, "
            f"{before[2]:.2f}; after: {after[0]:.2f}, {after[1]:.2f}, {after[2]:.2f} "
            f"on {cores} cores."
            + (
                " **The machine was shared with other jobs while this ran**: absolute figures "
                "are low and noisy, and only the side-by-side ratios mean much."
                if shared
                else ""
            ),
            "",
            "Model and data: the mnist pipeline (small_cnn, 4,000 training digits, "
            "global batch 64).",
            "In-process comparisons run their variants in turns, one epoch each per round "
            f"({single['rounds']} rounds after a warm-up round that is not kept), and give the "
            "median of the per-round ratios. *value* is from wall-clock time (the verdict uses "
            "it); *CPU-time ratio* is the same comparison from the process's CPU time, which "
            "other jobs on the machine barely affect. *previous run* is the value of the "
            f"`make bench` before this one ({figures['previous_run']}).",
            "",
            *table,
            "",
            "## Figures",
            "",
            f"- custom loop one_device: {single['stratoflow_examples_per_second']:.0f} "
            f"examples/s; bare Keras fit: {single['keras_fit_examples_per_second']:.0f}; "
            "the custom loop fed by in-memory tensors: "
            f"{single['synthetic_input_examples_per_second']:.0f} (medians of the rounds)",
            f"- XLA: the same Keras fit with `jit_compile=True`: "
            f"{single['keras_fit_xla_examples_per_second']:.0f} examples/s (Keras' default on a "
            "CPU-only host, and stratoflow's, is no XLA)",
            f"- one epoch's metrics reaching MLflow (one `log_batch`, between two epochs): "
            f"{figures['epoch_logging']['sqlite'] * 1000:.1f} ms on the local SQLite store, "
            f"{figures['epoch_logging']['server'] * 1000:.1f} ms through an MLflow server; "
            f"an epoch (one_device) takes {_epoch_seconds(single) * 1000:.0f} ms",
            f"- mirrored(2): {mirrored['mirrored_examples_per_second']:.0f} examples/s; "
            f"one_device in the same process: {mirrored['one_device_examples_per_second']:.0f}",
            f"- training process runs (task API, {CLUSTER_EPOCHS} epochs, median of "
            f"{CLUSTER_REPEATS}): "
            + "; ".join(
                f"{name} {run['examples_per_second']:.0f} examples/s, "
                f"task {run['task_wall_seconds']:.0f} s, "
                f"first step after {run['seconds_to_first_step']:.1f} s, "
                f"peak RSS {run['peak_rss_mb']:.0f} MB"
                for name, run in cluster.items()
            ),
            _streaming_figures(figures["streaming"]),
            f"- training step: {single['training_flops_per_example'] / 1e6:.1f} MFLOP per "
            f"example (3 x forward); matmul {single['matmul_flops_per_second'] / 1e9:.1f} "
            "GFLOP/s",
            "- whole DAG run (`airflow dags test`, default mnist): "
            f"{orchestration['wall_seconds']:.0f} s, of which "
            f"{orchestration['wall_seconds'] - tasks_total:.1f} s outside the tasks "
            "(the same command on a DAG of as many empty tasks: "
            + ", ".join(f"{s:.1f}" for s in orchestration["airflow_floor_seconds"])
            + " s outside them) "
            f"(`make run` in all, with its checks and summary: "
            f"{orchestration['make_run_seconds']:.0f} s); "
            "tasks: "
            + ", ".join(
                f"{task} {seconds:.1f} s" for task, seconds in orchestration["task_seconds"].items()
            )
            + f"; training itself {orchestration['train_seconds']:.1f} s; first step "
            f"{orchestration['seconds_to_first_step']:.1f} s after the training process started; "
            f"test accuracy {orchestration['test_accuracy']:.3f}",
            _fixed_cost_line(figures["fixed_cost"]),
            *_ray_lines(figures["ray"]),
            "",
            "## Where the time outside training goes",
            "",
            "Profiled with py-spy on 2026-12-03 (a `dags test` of the digits pipeline) and by "
            "timestamps in the task logs, under load:",
            "",
            "- Airflow's own fixed costs: the CLI's start, DAG parsing and the DAG run's creation "
            "(2-3.5 s), the in-process execution API that `dags test` builds for the first task "
            "(FastAPI + Cadwyn schema generation, 4-6 s, partly counted in prepare_dataset's "
            "duration) and the CLI's teardown. With the tasks now much shorter they are the "
            "whole overhead ratio.",
            "- What of it was stratoflow's (2026-12-07, cProfile of a `dags test` of retrain_mnist "
            "with every task marked success, 3.8-4.0 s): the DAG folder is parsed and its DAGs "
            "serialised twice (the CLI's lookup, then `dag.test`'s re-sync), and each parse built "
            "all 11 DAGs, twice (both DAG files call `build_dags`), reading every pipeline.yaml "
            "48 times with PyYAML's pure-Python parser (0.4 s of a 0.7 s parse); serialising the "
            "DAGs validates every Param's schema against JSON Schema's metaschema once per task "
            "(0.27 s for the 11). Now the files are parsed by libyaml, once per text, and a parse "
            "for one DAG (Airflow's parsing context, which `dags test` and a task's process set) "
            "builds and serialises that DAG alone: 2.7-3.0 s for the same command, and 3.7-3.8 s "
            "outside the tasks of a default mnist run (4.8-5.2 s before; three runs each).",
            "- Airflow's own floor (2026-12-08): the same `dags test` of a DAG of as many tasks "
            "that do nothing (`benchmarks/airflow_floor.py`; this run's figures in brackets "
            "above; 3.0-3.2 s in runs by hand the same day) is the CLI's start, the parses and the "
            "DAG run's creation, and the part of the in-process execution API's build before the "
            "first task's start. A stratoflow run spends 0.4-0.5 s more (its DAG files and "
            'Params, parsed and serialised twice); the row "beyond Airflow\'s own" is that '
            "over the wall time. A default mnist run of 35-37 s is at 0.09-0.095 from the floor "
            "alone: the 0.10 target leaves stratoflow about 0.2 s outside its tasks.",
            "- The same on a quiet machine (second session of 2026-12-03, 4 `dags test` runs of "
            "default mnist, 24-27 s each): 3.3-3.5 s outside the tasks (0.13-0.14). Starting "
            "the `airflow` CLI alone takes 1.45 s; from the DAG run's start to the first task's "
            "start 1.65 s; between tasks 0.02 s; after the last task 0.07 s. Parsing only the "
            "retrain DAG's file (`dags test -f`) saved nothing measurable (3.3-3.5 s either "
            "way). The ratio would reach 10 % only with a run of 33 s or more.",
            "- The interpreter's final garbage collection over TensorFlow's, Keras' and "
            "MLflow's objects when `dags test` exits (4-7 s, ~20 % of its main thread's samples "
            "were in the collector) and when the training process exits (~2.5 s): removed, every "
            "step and the training process `gc.freeze()` the heap (exit now ~0.2 s).",
            "- Python bytecode: with `PYTHONDONTWRITEBYTECODE` set, each process recompiled "
            "TensorFlow's sources on import (tensorflow + keras: 19.6 s instead of 7.1 s); "
            "`make install` now compiles the venv once (`make run` lets its processes write the "
            "bytecode of what they import instead: docs/reference/install.md). This shortened "
            "every task that imports TensorFlow, the training process's start most.",
            "- Still paid inside the tasks: TensorFlow's import in the training process (the "
            "training runs in a child by design, so a native crash cannot take the task down; "
            "the tasks after it read the test outputs it recorded and import no TensorFlow); "
            "MLflow's import. Not paid any more by a run whose pipeline code, data "
            "and configuration equal a passed own-code check's: its child is not started (issue "
            "29; where a run's fixed cost goes: the hand-written section below).",
            "",
            "## Why streamed input misses its target on this host",
            "",
            "Measured by hand on 2026-12-07 (2-core AMD EPYC host, nothing else running; "
            "docs: the hand-written items of issue 29 below): the streamed input's own work is "
            "reading the records (7-8 µs of CPU per example), the batched parse, decode and "
            "scaling (4.5 µs) and the shuffle buffer and batching (the rest, about 20 µs in all) "
            "against the 440 µs of CPU a training step takes per example: 4.5 %, the CPU-time "
            "ratio's 0.95 (this run: "
            f"{figures['streaming']['cpu_time']['streamed_vs_synthetic']:.3f}). On 2 cores the "
            "training step keeps both busy (1,560 of 1,600 core-ticks over 8 s of the "
            "benchmark), so the input's work delays the step instead of filling idle time, and "
            "the wall-clock ratio stays below the CPU-time one. Reaching 0.95 on wall time needs "
            "a core the training does not use.",
            "",
            "## Why multi-worker mirrored misses its target",
            "",
            "Measured by hand on 2026-12-03 (task API, 3 epochs, under load; ratio to "
            "one_device with 2 intra-op threads in the same script): multi_worker_mirrored with "
            "**1** worker (2 threads) 1.21, so the strategy and the loop cost nothing by "
            "themselves; with 2 workers 0.475 (2 threads each) and 0.487 (1 each), so thread "
            "over-subscription is not it either; with 2 workers and batch 256 0.30. Measured "
            "again on a quiet machine (second session of 2026-12-03, Keras `fit` on in-memory "
            "tensors, medians of epochs): one process gains little from its second thread on "
            "this model (1 thread, batch 32: 5,710 examples/s; 2 threads, batch 64: 6,050), and "
            "two 1-thread processes running side by side get 3,140-3,900 examples/s each, "
            "0.55-0.68 of a lone one: the 2 vCPUs do not give two independent cores' worth. A "
            "2-worker all-reduce of the 0.90 MB gradient takes 2.4 ms on an idle host (a scalar "
            "one 0.8 ms; RING and AUTO alike), and more while both cores compute. Dropping the "
            "per-step all-reduces of loss and accuracy (summing them locally instead) changed "
            "nothing: 2,963 vs 2,963 examples/s over 8 epochs. So the ceiling here is the host: "
            "two workers share less than two cores' worth of compute and still have to meet at "
            "an all-reduce every step. A host with a free core per worker is needed to tell "
            "more.",
            "",
            "## Noise on this machine",
            "",
            "Epoch times on these VMs are bimodal: in one `make bench` (second session of "
            "2026-12-03) the custom loop's epochs took 0.62-0.67 s or 1.30 s, mirrored's 1.41, "
            "2.70 or 5.29 s (factors of exactly 2), Keras fit's likewise, while the matmul "
            "probe between them stayed within 0.59-0.65 s. A ratio is only trustworthy when "
            "both of its sides run back to back, so each round runs them in that order (fit, "
            "the loop, synthetic input); with the slow XLA variant between the loop and "
            "synthetic input, the real-vs-synthetic ratio read 0.885 in one run and 1.000 once "
            "they were adjacent again.",
            "",
            "## Scaling on paper",
            "",
            f"One synchronous step of this model moves its gradients once: {params:,} float32 "
            f"parameters = {gradient_mb:.2f} MB. A ring all-reduce over N workers sends "
            f"2(N-1)/N of that per worker: {2 * gradient_mb:.2f} MB at large N. The measured step "
            f"(one_device, batch {batch}) takes {step_seconds * 1e3:.1f} ms on this host, so on a "
            f"10 Gb/s network (~1.2 GB/s) the all-reduce costs ~{allreduce_ms:.1f} ms per step, "
            f"{allreduce_ms / (step_seconds * 1e3) * 100:.0f} % of a step: "
            "multi-worker mirrored across hosts pays off for this model once each host "
            "computes a step at least as fast as here, and more so with larger per-worker batches "
            "(the communication is per step, the compute per example). On one 2-core host, "
            "several workers only split the same two cores, so the ratio above is the overhead "
            "of the cluster, not a speed-up. Parameter-server training sends each worker's "
            "gradients to the ps and pulls the weights back every step (2 x the model per step "
            "per worker through the ps), so the ps link saturates first; it pays off when "
            "workers are many, heterogeneous or preemptible, not for raw speed.",
            "",
        ]
    )


if __name__ == "__main__":
    main()
