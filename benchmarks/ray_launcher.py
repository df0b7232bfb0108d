"""`make bench`'s Ray figures: the `ray` launcher against `local` on the same run, Ray's own
memory, and the recoveries (a killed worker, a killed host, for both strategies), plus what a
run does when the Ray head dies.

The Ray cluster is the tests' one (`tests/support/ray_hosts.py`): a head and two worker hosts as
network namespaces on this machine. Every run is `stratoflow.tasks.train.train` (the training task's
body) started on the head host by `python -m benchmarks.ray_launcher run CONF OUT`, so the `local`
launcher runs its members there too and both sides use the same cores. Run alone:
`python -m benchmarks.ray_launcher` prints the figures as JSON; `python -m benchmarks.ray_launcher
throughput [ROUNDS [PARTIAL [EPOCHS]]]` only the local-vs-ray throughput pairs (no recoveries),
each with what its member processes run with (`member_settings`: threads, nice level, CPU
affinity).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger("benchmarks.ray")

EPOCHS = 3  # the first epoch (tracing, cluster warm-up) is not counted in the throughput
MWMS = {"strategy": "multi_worker_mirrored", "workers": 2}
PS = {"strategy": "parameter_server", "workers": 2, "ps": 1}
# Local-then-ray pairs per strategy in `make bench`; the ratio is their median. One 3-epoch pair
# ranged 0.48-1.45 on this host (docs/BENCHMARKS.md, "The ray launcher's throughput").
THROUGHPUT_PAIRS = 3
# A recovery run's epochs: enough that the spares are warm (every actor's, importing beside the
# training) before the first checkpoint's epoch is over, and training goes on after the kill.
RECOVERY_EPOCHS = 6
# With `warm_spares`, every actor of a Ray run keeps a spare (`_RayCluster.keep_spares`).
SPARES_KEPT = {"multi_worker_mirrored": 2, "parameter_server": 4}


def run(conf: dict[str, Any], out: str) -> None:
    """Prepare and train one mnist run with `conf` (inside a host); write its figures."""
    from stratoflow.distributed.launcher import ChildProcessFailed
    from stratoflow.tasks import prepare, train
    from stratoflow.tasks.run_context import AirflowRun
    from stratoflow.tracking import mlflow_runs

    # What the launcher says, for the bench to see when the spares are warm (`_said_path`).
    said = logging.FileHandler(_said_path(out))
    said.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    distributed = logging.getLogger("stratoflow.distributed")
    distributed.addHandler(said)
    distributed.setLevel(logging.INFO)
    airflow_run = AirflowRun("retrain_mnist", f"bench__{uuid.uuid4().hex[:8]}")
    prepared = prepare.prepare("mnist", {"epochs": EPOCHS, **conf}, airflow_run)
    started = time.time()
    figures: dict[str, Any] = {"started": started}
    try:
        trained = train.train(airflow_run, prepared)
    except ChildProcessFailed as error:
        figures["error"] = str(error)[:2000]
        figures["failed_at"] = time.time()
    else:
        client = mlflow_runs.client()
        rates = sorted(
            client.get_metric_history(trained.mlflow_run_id, "examples_per_second"),
            key=lambda metric: metric.step,
        )
        metrics = client.get_run(trained.mlflow_run_id).data.metrics
        recoveries = client.get_metric_history(trained.mlflow_run_id, "recovery_seconds")
        figures |= {
            "task_wall_seconds": time.time() - started,
            "examples_per_second": statistics.median(m.value for m in rates[1:]),
            "seconds_to_first_step": metrics.get("seconds_to_first_step"),
            "restarts": metrics.get("restarts"),
            "recovery_seconds": [m.value for m in recoveries],
        }
    Path(out).write_text(json.dumps(figures))


class _Figures(dict[str, Any]):
    """The figures, also written to `path` as each arrives (a long run keeps what it measured)."""

    def __init__(self, path: Path | None):
        super().__init__()
        self.path = path

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        if self.path is not None:
            self.path.write_text(json.dumps(self, indent=1))


def measure(partial: Path | None = None) -> dict[str, Any]:
    """Every Ray figure of `make bench` (see the module docstring); also written to `partial`
    as they come, if given."""
    from tests.support.ray_hosts import HEAD, ray_hosts

    figures = _Figures(partial)
    started = time.monotonic()
    with ray_hosts(workers=2) as hosts:
        figures["ray_start_seconds"] = time.monotonic() - started
        figures["ray_memory_mb"] = hosts.ray_memory_mb()
        figures["ray_processes"] = sum(len(hosts.pids(host)) for host in hosts.hosts)

        def on_head(
            conf: dict[str, Any], during: Callable[[], Any] | None = None, spares: int = 0
        ) -> dict[str, Any]:
            return _on_head(hosts, conf, during, spares=spares)

        for number in range(1, THROUGHPUT_PAIRS + 1):
            for name, conf in (("multi_worker_mirrored", MWMS), ("parameter_server", PS)):
                for launcher in ("local", "ray"):
                    logger.info("pair %d: %s, launcher %s", number, name, launcher)
                    figures[_throughput_key(number, name, launcher)] = on_head(
                        {**conf, "launcher": launcher}
                    )

        _recoveries(hosts, on_head, figures)

        def kill_ray_head() -> dict[str, Any]:
            # The head's Ray processes only: the driver (the training task) lives on.
            import psutil

            for pid in hosts.pids(HEAD):
                process = psutil.Process(pid)
                if "benchmarks.ray_launcher" not in " ".join(process.cmdline()):
                    process.kill()
            return {"killed_at": time.time()}

        logger.info("multi_worker_mirrored, launcher ray, the Ray head killed")
        figures["multi_worker_mirrored/ray/head killed"] = on_head(
            {**MWMS, "launcher": "ray", "max_restarts": 2}, kill_ray_head
        )
    return dict(figures)


def _throughput_key(number: int, name: str, launcher: str) -> str:
    """Where `measure` keeps pair `number`'s run: the first pair's under its plain name, which
    the Ray section's per-run lines read."""
    return f"{name}/{launcher}" if number == 1 else f"{number}/{name}/{launcher}"


def throughput_ratios(figures: dict[str, Any], name: str) -> list[float]:
    """Ray's examples/s over local's, pair by pair (`measure`'s keys), for strategy `name`."""
    ratios = []
    for number in range(1, THROUGHPUT_PAIRS + 1):
        local = figures.get(_throughput_key(number, name, "local"))
        on_ray = figures.get(_throughput_key(number, name, "ray"))
        if local and on_ray and "examples_per_second" in local and "examples_per_second" in on_ray:
            ratios.append(on_ray["examples_per_second"] / local["examples_per_second"])
    return ratios


def _recoveries(
    hosts: Any, on_head: Callable[..., dict[str, Any]], figures: dict[str, Any], rounds: int = 1
) -> None:
    """Worker 1 killed (local; ray without and with warm spares) and its host killed (ray,
    without and with warm spares), for both strategies, `rounds` times; into `figures`."""

    def kill_worker_1() -> dict[str, Any]:
        victim = _member(hosts, "worker", 1)
        victim.kill()
        return {"killed_at": time.time()}

    def kill_host_of_worker_1() -> dict[str, Any]:
        victim = _member(hosts, "worker", 1)
        host = next(h for h in hosts.worker_hosts if victim.pid in hosts.pids(h))
        hosts.kill_host(host)
        return {"killed_at": time.time(), "killed_host": host}

    for number in range(1, rounds + 1):
        prefix = f"{number}/" if rounds > 1 else ""
        for name, conf in (("multi_worker_mirrored", MWMS), ("parameter_server", PS)):
            spread = {**conf, "placement": "spread", "epochs": RECOVERY_EPOCHS}
            ray: dict[str, Any] = {"launcher": "ray"}
            spares: dict[str, Any] = {"launcher": "ray", "warm_spares": True}
            cases: list[tuple[str, dict[str, Any], Callable[[], dict[str, Any]]]] = [
                ("local/worker killed", {"launcher": "local"}, kill_worker_1),
                ("ray/worker killed", ray, kill_worker_1),
                ("ray/worker killed, warm spares", spares, kill_worker_1),
                ("ray/host killed", ray, kill_host_of_worker_1),
                ("ray/host killed, warm spares", spares, kill_host_of_worker_1),
            ]
            for case, settings, kill in cases:
                logger.info("%s, %s", name, case)
                warm = SPARES_KEPT[name] if settings.get("warm_spares") else 0
                figures[f"{prefix}{name}/{case}"] = on_head({**spread, **settings}, kill, warm)
                for host in hosts.worker_hosts:  # a killed host's node starts again
                    if not hosts.pids(host):
                        hosts.start_node(host)


def recovery(rounds: int = 1, partial: Path | None = None) -> dict[str, Any]:
    """The recovery part of `measure` alone, `rounds` times."""
    from tests.support.ray_hosts import ray_hosts

    figures = _Figures(partial)
    with ray_hosts(workers=2) as hosts:

        def on_head(
            conf: dict[str, Any], during: Callable[[], Any] | None = None, spares: int = 0
        ) -> dict[str, Any]:
            return _on_head(hosts, conf, during, spares=spares)

        _recoveries(hosts, on_head, figures, rounds)
    return dict(figures)


def throughput(
    rounds: int = 1, partial: Path | None = None, epochs: int = EPOCHS
) -> dict[str, Any]:
    """The throughput part of `measure` alone, `rounds` times (local then ray, back to back),
    with what each member process runs with (`member_settings`) seen at the first checkpoint;
    more `epochs` than `make bench`'s make each figure steadier on a busy host."""
    from tests.support.ray_hosts import ray_hosts

    figures = _Figures(partial)
    with ray_hosts(workers=2) as hosts:
        for number in range(1, rounds + 1):
            for name, conf in (("multi_worker_mirrored", MWMS), ("parameter_server", PS)):
                for launcher in ("local", "ray"):
                    logger.info("round %d: %s, launcher %s", number, name, launcher)
                    figures[f"{number}/{name}/{launcher}"] = _on_head(
                        hosts,
                        {**conf, "launcher": launcher, "epochs": epochs},
                        lambda: member_settings(hosts),
                        load=True,
                    )
    return dict(figures)


MEMBER_MODULES = ("stratoflow.training.worker", "stratoflow.distributed.server")
# The variables that tune a member's threads.
THREAD_VARIABLES = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")


def member_settings(hosts: Any, window_seconds: float = 1.0) -> dict[str, Any]:
    """What every member process on the hosts runs with (its thread variables, threads, CPU
    affinity, nice level, variables by name), its share of a core over `window_seconds`, and the
    share of everything else running in the hosts' namespaces (Ray, the driver)."""
    import psutil

    seen = []
    for host in hosts.hosts:
        for pid in hosts.pids(host):
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(pid)
                seen.append((host, process, process.cpu_times(), " ".join(process.cmdline())))
    members: dict[str, Any] = {}
    for host, process, _, command in seen:
        if any(module in command for module in MEMBER_MODULES):
            with contextlib.suppress(psutil.Error):
                environ = process.environ()
                task = json.loads(environ.get("TF_CONFIG") or "{}").get("task", {})
                members[f"{task.get('type')}_{task.get('index')}"] = {
                    "pid": process.pid,
                    "host": host,
                    "threads": process.num_threads(),
                    "affinity": process.cpu_affinity(),
                    "nice": process.nice(),
                    **{name: environ.get(name) for name in THREAD_VARIABLES},
                    "variables": sorted(environ),
                }
    time.sleep(window_seconds)
    others = 0.0
    for _, process, before, command in seen:
        with contextlib.suppress(psutil.Error):
            after = process.cpu_times()
            share = (after.user + after.system - before.user - before.system) / window_seconds
            if any(module in command for module in MEMBER_MODULES):
                for member in members.values():
                    if member["pid"] == process.pid:
                        member["cpu_share"] = round(share, 3)
            else:
                others += share
    return {"members": members, "others_cpu_share": round(others, 3)}


def _on_head(
    hosts: Any,
    conf: dict[str, Any],
    during: Callable[[], Any] | None = None,
    load: bool = False,
    spares: int = 0,
) -> dict[str, Any]:
    """Run `conf` on the head host (`run`); `during` is called at the first checkpoint, once
    `spares` warm spares are ready."""
    from tests.support.ray_hosts import HEAD

    with tempfile.TemporaryDirectory(prefix="stratoflow-bench-ray-") as folder:
        out = Path(folder) / "figures.json"
        command = [sys.executable, "-m", "benchmarks.ray_launcher", "run"]
        env = {**hosts.env(), "STRATOFLOW_RAY_ADDRESS": hosts.ray_address}
        load_before = os.getloadavg()[0]
        process = subprocess.Popen(
            hosts.in_host(HEAD, [*command, json.dumps(conf), str(out)]),
            env=env,
            cwd=Path(__file__).resolve().parents[1],
        )
        acted: dict[str, Any] = {}
        if during is not None:
            acted = _at_first_checkpoint(process, during, _said_path(str(out)), spares)
        returncode = process.wait(timeout=1200)
        if load:
            acted["load_average_1min"] = [load_before, os.getloadavg()[0]]
        if not out.exists():  # the task process itself died (e.g. with the Ray head)
            return acted | {
                "error": f"the task process died (exit status {returncode})",
                "failed_at": time.time(),
            }
        result = json.loads(out.read_text())
        return result | acted


def _member(hosts: Any, job: str, index: int) -> Any:
    import psutil

    for host in hosts.worker_hosts + [hosts.hosts[0]]:
        for pid in hosts.pids(host):
            try:
                process = psutil.Process(pid)
                config = json.loads(process.environ().get("TF_CONFIG") or "{}")
            except (psutil.Error, json.JSONDecodeError):
                continue
            if config.get("task") == {"type": job, "index": index}:
                return process
    raise RuntimeError(f"no {job} {index} is running on the hosts")


def _said_path(out: str) -> Path:
    return Path(f"{out}.said")


def _at_first_checkpoint(
    process: subprocess.Popen[bytes],
    act: Callable[[], dict[str, Any]],
    said: Path | None = None,
    spares: int = 0,
) -> dict[str, Any]:
    """Call `act` once the run wrote its first checkpoint and `spares` spares are warm."""
    from stratoflow.config import locations

    since = time.time()
    runs = locations.state_dir() / "runs"
    checkpointed = False
    while process.poll() is None:
        checkpointed = checkpointed or any(
            path.stat().st_mtime > since for path in runs.glob("*/*/checkpoints/ckpt-1.index")
        )
        warm = 0
        if spares and said is not None and said.exists():
            warm = said.read_text().count("warm spare ready")
        if checkpointed and warm >= spares:
            return act() | {"warm_spares_ready": warm}
        time.sleep(0.2)
    return {}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if sys.argv[1:2] == ["run"]:
        run(json.loads(sys.argv[2]), sys.argv[3])
    elif sys.argv[1:2] == ["recovery"]:  # recovery [ROUNDS [PARTIAL]]
        from benchmarks.throwaway import use_throwaway_state

        use_throwaway_state()
        rounds = int(sys.argv[2]) if sys.argv[2:] else 1
        partial = Path(sys.argv[3]) if sys.argv[3:] else None
        sys.stdout.write(json.dumps(recovery(rounds, partial), indent=1) + "\n")
    elif sys.argv[1:2] == ["throughput"]:  # throughput [ROUNDS [PARTIAL [EPOCHS]]]
        from benchmarks.throwaway import use_throwaway_state

        use_throwaway_state()
        rounds = int(sys.argv[2]) if sys.argv[2:] else 1
        partial = Path(sys.argv[3]) if sys.argv[3:] else None
        epochs = int(sys.argv[4]) if sys.argv[4:] else EPOCHS
        sys.stdout.write(json.dumps(throughput(rounds, partial, epochs), indent=1) + "\n")
    else:
        from benchmarks.throwaway import use_throwaway_state

        use_throwaway_state()
        partial = Path(sys.argv[1]) if sys.argv[1:] else None
        sys.stdout.write(json.dumps(measure(partial), indent=1) + "\n")
