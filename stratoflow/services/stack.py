"""A stack in a state folder: start it, stop it, restart one component, measure it.

The components (`stratoflow.services.config`) start in order: PostgreSQL, then MLflow's server
and Airflow's DB migration side by side, then the four Airflow components. A stack started
with `attached=True` (the test fixtures) dies with the process that started it;
`attached=False` (the command line) leaves it running until `stratoflow services down`, which
finds its processes again through `services.json`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratoflow.config import locations, names
from stratoflow.distributed.cluster import free_ports
from stratoflow.distributed.processes import ManagedProcess, die_with_parent, stop_tree
from stratoflow.services import postgres
from stratoflow.services.config import (
    ADMIN_ROLE,
    ADMIN_USER,
    AIRFLOW_COMPONENTS,
    API_SERVER,
    COMPONENTS,
    DAG_PROCESSOR,
    DATABASES,
    HOST,
    MLFLOW,
    MLFLOW_ADMIN_USER,
    MLFLOW_SERVICE_USER,
    POSTGRES,
    RAY_CLIENT,
    RAY_HEAD,
    SCHEDULER,
    StackConfig,
    command,
    environment,
    new_secrets,
)
from stratoflow.services.errors import ServiceError
from stratoflow.services.file_modes import (
    OWNER_ONLY_UMASK,
    private_folder,
    private_state_folder,
)
from stratoflow.services.state_files import tail, write_private

log = logging.getLogger(__name__)

START_TIMEOUT_SECONDS = 300.0
STOP_TIMEOUT_SECONDS = 30.0
RETIRED_GRACE_SECONDS = 3.0
STATE_FILE = "services.json"
SECRETS_FILE = "secrets.json"


@dataclass
class StartReport:
    """What `Stack.up` measured.

    Attributes:
        seconds_to_healthy: from the call to every component answering its health check.
        seconds_per_component: PostgreSQL's start, then the Airflow DB migration, MLflow and
            Airflow, each counted from PostgreSQL being ready (they start in parallel).
        rss_mb: the sum of the resident memory of every process of the stack.
        pss_mb: the same with shared pages split between their processes (None if unreadable).
        processes: how many processes the stack runs.
        name_problems: the pipelines' MLflow names another user owns, each with its fix (the
            runs of those pipelines refuse to start).
    """

    seconds_to_healthy: float
    seconds_per_component: dict[str, float]
    rss_mb: float
    pss_mb: float | None
    processes: int
    name_problems: list[str] = field(default_factory=list)

    def describe(self) -> str:
        pss = f", PSS {self.pss_mb:.0f} MB" if self.pss_mb is not None else ""
        phases = dict(self.seconds_per_component)
        first = f"postgres {phases.pop(POSTGRES, 0):.1f} s"
        parts = ", ".join(f"{name} {sec:.1f} s" for name, sec in phases.items())
        return (
            f"stack healthy in {self.seconds_to_healthy:.1f} s ({first}; then, in parallel, "
            f"ready after: {parts}); "
            f"{self.processes} processes, RSS {self.rss_mb:.0f} MB{pss}"
        )


class Stack:
    """A stack in a state folder: start it, stop it, restart one component, measure it.

    Args:
        state_dir: the stack's folder (created on `up`).
        attached: the components die with this process (tests) instead of outliving it (CLI).
        data_dir: the TFDS data dir of the tasks; `stratoflow.config.locations.data_dir()` by
        default.
    """

    def __init__(self, state_dir: Path, *, attached: bool = True, data_dir: Path | None = None):
        self.state_dir = Path(state_dir).resolve()
        self.attached = attached
        self._data_dir = data_dir
        self.config: StackConfig | None = None
        self.processes: dict[str, ManagedProcess] = {}
        # Process groups of components that were restarted (their leftovers are stopped too).
        self.retired: list[ManagedProcess] = []
        if (self.state_dir / STATE_FILE).is_file():
            self._load_state()

    # ----- lifecycle -------------------------------------------------------------------------

    def up(
        self, timeout_seconds: float = START_TIMEOUT_SECONDS, *, ray: bool = False
    ) -> StartReport:
        """Start every component and wait until each is healthy.

        With `ray`, also a single-node Ray head on 127.0.0.1 (token auth, no dashboard), which
        the Airflow tasks' `launcher: ray` runs use ($STRATOFLOW_RAY_ADDRESS).

        Raises:
            ServiceError: the stack already runs, or a component did not become healthy in
                time (the message quotes its log); whatever started is stopped again.
        """
        running = self.running()
        if running:
            raise ServiceError(
                f"the stack in {self.state_dir} is already running ({', '.join(running)}); "
                "stop it first with `stratoflow services down`"
            )
        started = time.monotonic()
        deadline = started + timeout_seconds
        timings: dict[str, float] = {}
        self.processes, self.retired = {}, []
        self.config = self._prepare_config(ray)
        try:
            if ray:  # its start (10-30 s) overlaps PostgreSQL's and the migrations
                self.start_component(RAY_HEAD)
            self._start_postgres(deadline)
            timings[POSTGRES] = time.monotonic() - started
            mark = time.monotonic()
            # MLflow migrates its stores while Airflow migrates its metadata DB.
            self._write_mlflow_auth_config()
            self.start_component(MLFLOW)
            self._migrate_airflow_db(deadline)
            timings["airflow-db-migrate"] = time.monotonic() - mark
            self._ensure_airflow_admin(deadline)
            for component in AIRFLOW_COMPONENTS:
                self.start_component(component)
            self.wait_healthy(MLFLOW, deadline)
            name_problems = self._ensure_mlflow_service_account()
            timings[MLFLOW] = time.monotonic() - mark
            self.wait_healthy(API_SERVER, deadline)
            timings["airflow"] = time.monotonic() - mark
            if ray:
                self.wait_healthy(RAY_HEAD, deadline)
                timings[RAY_HEAD] = time.monotonic() - mark
        except BaseException:
            self.down()
            raise
        seconds = time.monotonic() - started
        rss, pss, count = self.memory()
        report = StartReport(seconds, timings, rss, pss, count, name_problems)
        log.info("%s", report.describe())
        return report

    def down(self) -> None:
        """Stop every component (reverse start order): SIGTERM, then SIGKILL after a grace period.

        PostgreSQL gets a fast shutdown (`pg_ctl stop -m fast`). Idempotent.
        """
        for process in self.retired:
            # What a killed component left behind (e.g. idle executor workers): no grace.
            stop_tree(process, "leftovers", RETIRED_GRACE_SECONDS)
        self.retired = []
        for component in (RAY_HEAD, *reversed(COMPONENTS)):
            if component in self.processes:
                self.stop_component(component)
        if self.config is not None:
            shutil.rmtree(self.config.ray_private_dir, ignore_errors=True)
        self._save_state()

    def start_component(self, component: str) -> None:
        """Start one component (again); its output is appended to `logs/<component>.log`.

        It runs with umask 077: what it writes is its owner's only (`file_modes`).
        """
        config = self._require_config()
        private_folder(config.logs_dir)
        env = {**os.environ, **environment(component, config)}
        log_path = config.logs_dir / f"{component}.log"
        descriptor = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with open(descriptor, "ab") as log_file:
            popen = subprocess.Popen(
                command(component, config),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(config.postgres_dir if component == POSTGRES else config.state_dir),
                # Its own process group, so stopping it stops its children too.
                start_new_session=True,
                umask=OWNER_ONLY_UMASK,
                preexec_fn=die_with_parent(signal.SIGTERM) if self.attached else None,
                **(postgres.as_server_user() if component == POSTGRES else {}),
            )
        self.processes[component] = ManagedProcess.started(popen)
        self._save_state()
        log.info("%s started (pid %d)", component, popen.pid)

    def stop_component(self, component: str, *, kill: bool = False) -> None:
        """Stop one component: gracefully, or with SIGKILL to its main process if `kill`.

        A killed component's process group is remembered, so `down` stops what it left behind.
        """
        process = self.processes.pop(component, None)
        if process is None:
            return
        if kill:
            with contextlib.suppress(ProcessLookupError):
                if process.is_alive():
                    os.kill(process.pid, signal.SIGKILL)
            if process.popen is not None:
                process.popen.wait()
            self.retired.append(process)
        elif component == POSTGRES:
            self._stop_postgres(process)
        else:
            stop_tree(process, component, STOP_TIMEOUT_SECONDS)
        self._save_state()
        log.info("%s stopped", component)

    def running(self) -> list[str]:
        """The components whose process is alive."""
        return [name for name, process in self.processes.items() if process.is_alive()]

    # ----- health ----------------------------------------------------------------------------

    def wait_healthy(self, component: str, deadline: float) -> None:
        """Wait until `component` answers its health check.

        Raises:
            ServiceError: it exited, or is not healthy by `deadline`; the message quotes the
                last lines of its log.
        """
        check = self._health_checks()[component]
        last_problem = "no answer yet"
        while True:
            process = self.processes.get(component)
            if process is None or not process.is_alive():
                raise self._failure(component, "exited during start-up")
            problem = check()
            if problem is None:
                return
            last_problem = problem
            if time.monotonic() > deadline:
                raise self._failure(component, f"was not healthy in time ({last_problem})")
            time.sleep(0.5)

    def _health_checks(self) -> dict[str, Callable[[], str | None]]:
        config = self._require_config()
        return {
            POSTGRES: lambda: postgres.readiness_problem(HOST, config.ports[POSTGRES]),
            MLFLOW: lambda: http_problem(f"{config.mlflow_uri}/health", lambda body: None),
            API_SERVER: lambda: http_problem(
                f"{config.api_url}/api/v2/monitor/health", airflow_health_problem
            ),
            # The GCS, and the Ray Client server, which starts last.
            RAY_HEAD: lambda: (
                tcp_problem(HOST, config.ports[RAY_HEAD])
                or tcp_problem(HOST, config.ports[RAY_CLIENT])
            ),
        }

    def _failure(self, component: str, what: str) -> ServiceError:
        config = self._require_config()
        path = config.logs_dir / f"{component}.log"
        last = tail(path)
        if component == POSTGRES:
            last = last or tail(config.postgres_dir / "postgres.log")
        return ServiceError(f"{component} {what}. Last lines of {path}:\n{last or '(empty)'}")

    # ----- measurements ----------------------------------------------------------------------

    def pids(self) -> dict[str, list[int]]:
        """component -> the PIDs of its process and all its descendants."""
        import psutil

        tree: dict[str, list[int]] = {}
        for component, process in self.processes.items():
            try:
                root = psutil.Process(process.pid)
                tree[component] = [root.pid, *(c.pid for c in root.children(recursive=True))]
            except psutil.NoSuchProcess:
                tree[component] = []
        return tree

    def memory(self) -> tuple[float, float | None, int]:
        """The stack's memory: (sum of RSS in MB, sum of PSS in MB or None, process count).

        RSS counts shared pages once per process, PSS splits them between the processes that
        share them, so the PSS sum is what the stack really occupies.
        """
        import psutil

        rss = pss = 0.0
        pss_known = True
        count = 0
        for pids in self.pids().values():
            for pid in pids:
                try:
                    process = psutil.Process(pid)
                    rss += process.memory_info().rss
                    try:
                        pss += process.memory_full_info().pss
                    except (psutil.AccessDenied, AttributeError):
                        pss_known = False
                    count += 1
                except psutil.NoSuchProcess:
                    continue
        mb = 1024 * 1024
        return rss / mb, (pss / mb if pss_known else None), count

    # ----- PostgreSQL ------------------------------------------------------------------------

    def _start_postgres(self, deadline: float) -> None:
        config = self._require_config()
        if not postgres.is_initialised(config.postgres_dir):
            postgres.initdb(config.postgres_dir, config.secrets["postgres_superuser_password"])
        self.start_component(POSTGRES)
        self.wait_healthy(POSTGRES, deadline)
        postgres.create_databases(
            HOST,
            config.ports[POSTGRES],
            config.secrets["postgres_superuser_password"],
            {db: (role, config.database_password(db)) for db, role in DATABASES.items()},
        )

    def _stop_postgres(self, process: ManagedProcess) -> None:
        postgres.fast_stop(self._require_config().postgres_dir, STOP_TIMEOUT_SECONDS)
        stop_tree(process, POSTGRES, STOP_TIMEOUT_SECONDS)

    # ----- Airflow ---------------------------------------------------------------------------

    def _migrate_airflow_db(self, deadline: float) -> None:
        from stratoflow.services.airflow_setup import AirflowSetupError, ensure_airflow_db

        config = self._require_config()
        env = {**os.environ, **environment(SCHEDULER, config)}
        try:
            ensure_airflow_db(config.airflow_home, env, timeout=max(deadline - time.monotonic(), 1))
        except AirflowSetupError as error:
            raise ServiceError(f"Airflow's metadata DB could not be migrated: {error}") from None

    def _ensure_airflow_admin(self, deadline: float) -> None:
        """Create the admin in FAB's user table, or reset its password to the secret's."""
        from stratoflow.services.airflow_users import PASSWORD_ENV

        config = self._require_config()
        env = {
            **os.environ,
            **environment(SCHEDULER, config),
            PASSWORD_ENV: config.admin_password,
        }
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "stratoflow.services.airflow_users",
                "--username",
                ADMIN_USER,
                "--role",
                ADMIN_ROLE,
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=max(deadline - time.monotonic(), 1),
            umask=OWNER_ONLY_UMASK,
        )
        if result.returncode:
            raise ServiceError(
                f"the Airflow admin could not be created (exit code {result.returncode}):\n"
                f"{(result.stdout + result.stderr)[-3000:]}"
            )

    # ----- MLflow ----------------------------------------------------------------------------

    def _write_mlflow_auth_config(self) -> None:
        from stratoflow.services.mlflow_auth import write_config

        config = self._require_config()
        write_config(config.mlflow_auth_config, config.database_uri("mlflow_auth"))

    def _ensure_mlflow_service_account(self) -> list[str]:
        """Create the tasks' MLflow account, or set its password to the secret's (a restart),
        and claim every pipeline's experiment and registered model for it.

        Returns:
            The names another user owns, each with its fix (also logged as warnings).
        """
        from stratoflow.config.assets import loadable_specs
        from stratoflow.services.mlflow_auth import (
            MlflowAuthError,
            claim_pipeline_names,
            ensure_account,
            report_claims,
        )
        from stratoflow.tracking.name_claims import ClaimError

        config = self._require_config()
        admin = (MLFLOW_ADMIN_USER, config.mlflow_admin_password)
        account = (MLFLOW_SERVICE_USER, config.mlflow_service_password)
        try:
            ensure_account(config.mlflow_uri, admin, *account)
            claims = claim_pipeline_names(config.mlflow_uri, admin, account, loadable_specs())
        except (MlflowAuthError, ClaimError) as error:
            raise ServiceError(str(error)) from None
        return report_claims(claims)

    # ----- state -----------------------------------------------------------------------------

    def _prepare_config(self, ray: bool = False) -> StackConfig:
        # 0700 (0711 as root: the postgres OS user passes through to postgres/), and whatever an
        # older stack left readable by others no longer is.
        private_state_folder(self.state_dir)
        secrets_path = self.state_dir / SECRETS_FILE
        stack_secrets = json.loads(secrets_path.read_text()) if secrets_path.is_file() else {}
        if set(new_secrets()) - set(stack_secrets):  # a new stack, or one from before a secret
            stack_secrets = {**new_secrets(), **stack_secrets}
            write_private(secrets_path, stack_secrets)
        components = (POSTGRES, MLFLOW, API_SERVER, *((RAY_HEAD, RAY_CLIENT) if ray else ()))
        ports = dict(zip(components, free_ports(len(components)), strict=True))
        config = StackConfig(
            state_dir=self.state_dir,
            ports=ports,
            secrets=stack_secrets,
            data_dir=(self._data_dir or locations.data_dir()).resolve(),
        )
        for folder in (config.airflow_home, config.artifacts_dir, config.logs_dir):
            private_folder(folder)
        if ray:  # Ray makes its session folders 0777: they go in a folder only we may enter
            shutil.rmtree(config.ray_private_dir, ignore_errors=True)
            private_folder(config.ray_private_dir)
        return config

    def _require_config(self) -> StackConfig:
        if self.config is None:
            raise ServiceError(f"no stack was started in {self.state_dir}")
        return self.config

    def _save_state(self) -> None:
        if self.config is None:
            return
        state = {
            "ports": dict(self.config.ports),
            "data_dir": str(self.config.data_dir),
            "processes": {name: p.to_dict() for name, p in self.processes.items()},
            "retired": [p.to_dict() for p in self.retired],
        }
        write_private(self.state_dir / STATE_FILE, state)

    def _load_state(self) -> None:
        state = json.loads((self.state_dir / STATE_FILE).read_text())
        self.config = StackConfig(
            state_dir=self.state_dir,
            ports=state["ports"],
            secrets=json.loads((self.state_dir / SECRETS_FILE).read_text()),
            data_dir=Path(state["data_dir"]),
        )
        self.processes = {
            name: ManagedProcess.from_dict(p) for name, p in state["processes"].items()
        }
        self.retired = [ManagedProcess.from_dict(p) for p in state.get("retired", [])]


def wait_for_dags(stack: Stack, timeout_seconds: float = 180.0) -> float:
    """Wait until the API lists every DAG of this repo (parsed by the dag-processor).

    Returns:
        The seconds waited.

    Raises:
        ServiceError: some DAG is still unknown after `timeout_seconds`.
    """
    from stratoflow.config.assets import datasets_in_use, loadable_specs
    from stratoflow.services.airflow_api import AirflowApi, AirflowApiError

    config = stack._require_config()
    expected = {names.retrain_dag_id(spec.name) for spec in loadable_specs()}
    expected |= {names.refresh_dag_id(d) for d in datasets_in_use()}
    api = AirflowApi(config.api_url, ADMIN_USER, config.admin_password)
    started = time.monotonic()
    try:
        while True:
            try:
                answer = api.request("GET", "/api/v2/dags", params={"limit": 100})
            except AirflowApiError as error:
                raise ServiceError(f"the Airflow API refused to list DAGs: {error}") from None
            missing = expected - {dag["dag_id"] for dag in answer["dags"]}
            if not missing:
                return time.monotonic() - started
            if time.monotonic() - started > timeout_seconds:
                raise stack._failure(
                    DAG_PROCESSOR,
                    f"has not parsed {', '.join(sorted(missing))} in {timeout_seconds:.0f} s",
                )
            time.sleep(1)
    finally:
        api.close()


def describe(stack: Stack, report: StartReport | None = None, dags_seconds: float = 0) -> str:
    """What `stratoflow services up|status` prints: where everything is and how to use it."""
    if stack.config is None:
        return f"no stack in {stack.state_dir}\n"
    config = stack.config
    running = stack.running()
    # A stack started with `--ray` has one component more: the Ray head.
    expected = [*COMPONENTS, *([RAY_HEAD] if config.ray_address else [])]
    lines = [f"stack in {stack.state_dir}: {len(running)}/{len(expected)} components running"]
    if running and (stopped := [name for name in expected if name not in running]):
        lines[0] += f" (not running: {', '.join(stopped)})"
    if report is not None:
        lines.append(f"  {report.describe()}; DAGs parsed {dags_seconds:.1f} s later")
        lines += [f"  WARNING: {problem}" for problem in report.name_problems]
    elif running:
        rss, pss, count = stack.memory()
        pss_text = f", PSS {pss:.0f} MB" if pss is not None else ""
        lines.append(f"  {count} processes, RSS {rss:.0f} MB{pss_text}")
    lines += [
        f"  Airflow UI and REST API: {config.api_url}  (user {ADMIN_USER}, password: "
        f"airflow_admin_password in {stack.state_dir / SECRETS_FILE})",
        f"  MLflow tracking server:  {config.mlflow_uri}  (user {MLFLOW_ADMIN_USER}, password: "
        f"mlflow_admin_password in {stack.state_dir / SECRETS_FILE})",
        f"  PostgreSQL:              {HOST}:{config.ports[POSTGRES]} (databases "
        f"{', '.join(DATABASES)})",
        *(
            [
                f"  Ray head:                {config.ray_address} (token: ray_auth_token in "
                f"{stack.state_dir / SECRETS_FILE}; `launcher: ray` runs use it)"
            ]
            if config.ray_address
            else []
        ),
        f"  logs: {config.logs_dir}",
        "",
    ]
    return "\n".join(lines)


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


def tcp_problem(host: str, port: int) -> str | None:
    """Why nothing accepts a TCP connection on host:port, or None."""
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError as error:
        return f"{host}:{port}: {error}"
    return None


def airflow_health_problem(body: Any) -> str | None:
    """Why Airflow's `/api/v2/monitor/health` answer is not all healthy, or None."""
    parts = ("metadatabase", "scheduler", "dag_processor", "triggerer")
    unhealthy = [
        f"{part}: {(body.get(part) or {}).get('status')}"
        for part in parts
        if (body.get(part) or {}).get("status") != "healthy"
    ]
    return "; ".join(unhealthy) or None
