"""Who may do what on the live services stack: Airflow's roles and MLflow's permissions.

Through the servers' real APIs (Airflow REST API v2 and the FAB auth manager's user API, MLflow's
REST API and MlflowClient), on the package's shared stack (conftest.py):

- anonymous requests get 401 from both servers;
- an Airflow viewer reads but its trigger, clear and pause get 403 and change nothing; an
  operator's trigger runs to success, and its clear is accepted;
- that run logs and registers in MLflow through the tasks' service account;
- an MLflow user without a grant reads, runs `stratoflow compare` and `stratoflow serve-model`
  (both refused without credentials), but setting `champion`, deleting a run and registering a
  version get 403, and the registry is unchanged;
- no password is in a process's command line, a task log or an MLflow param.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from stratoflow.config import names
from stratoflow.services.airflow_api import AirflowApi, AirflowApiError
from stratoflow.services.config import MLFLOW_ADMIN_USER, MLFLOW_SERVICE_USER
from tests.integration.services.stack import LiveStack, unpause_and_cancel_the_missed_slot
from tests.processes import STRATOFLOW, ServeModel

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)

DIGITS = "retrain_digits"
MODEL = "stratoflow-digits"
EXPERIMENT = names.experiment_name("digits")
# A short retrain: one epoch of the default strategy.
SHORT_CONF = {"epochs": 1}
RUN_TIMEOUT_S = 900


def _password() -> str:
    return secrets.token_urlsafe(18)


class Roles:
    """The users the tests sign in as, created by the admins through the servers' APIs."""

    def __init__(self, live: LiveStack):
        assert live.stack.config is not None
        self.live = live
        self.config = live.stack.config
        self.passwords = {"operator": _password(), "viewer": _password(), "reader": _password()}
        for username, role in (("operator", "Op"), ("viewer", "Viewer")):
            live.api.request(
                "POST",
                "/auth/fab/v1/users",
                json={
                    "username": username,
                    "email": f"{username}@example.com",
                    "first_name": username,
                    "last_name": "test",
                    "roles": [{"name": role}],
                    "password": self.passwords[username],
                },
            )
        self.operator = AirflowApi(live.api_url, "operator", self.passwords["operator"])
        self.viewer = AirflowApi(live.api_url, "viewer", self.passwords["viewer"])
        # An MLflow user with no grant: default_permission READ.
        created = httpx.post(
            f"{self.config.mlflow_uri}/api/2.0/mlflow/users/create",
            json={"username": "reader", "password": self.passwords["reader"]},
            auth=self.mlflow_admin,
            timeout=30,
        )
        assert created.status_code == 200, created.text
        self.operator_run: dict[str, Any] | None = None
        self.cmdlines: dict[int, str] = {}

    @property
    def mlflow_admin(self) -> tuple[str, str]:
        return (MLFLOW_ADMIN_USER, self.config.mlflow_admin_password)

    @property
    def reader(self) -> tuple[str, str]:
        return ("reader", self.passwords["reader"])

    def every_password(self) -> dict[str, str]:
        """Every secret of the stack and every test user's password, by name."""
        return {**self.config.secrets, **self.passwords}

    def mlflow_as_admin(self, method: str, path: str, **kwargs: Any) -> Any:
        answer = httpx.request(
            method, f"{self.config.mlflow_uri}{path}", auth=self.mlflow_admin, timeout=30, **kwargs
        )
        assert answer.status_code == 200, f"{method} {path}: {answer.status_code} {answer.text}"
        return answer.json()

    def permission(self, username: str, resource_type: str, resource_id: str) -> str:
        answer = self.mlflow_as_admin(
            "GET",
            "/api/3.0/mlflow/users/permissions/get",
            params={
                "username": username,
                "resource_type": resource_type,
                "resource_id": resource_id,
            },
        )
        return str(answer["permission"])

    def sample_cmdlines(self) -> None:
        """Remember the command line of every process of the stack (tasks included)."""
        for pids in self.live.stack.pids().values():
            for pid in pids:
                try:
                    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                self.cmdlines[pid] = raw.replace(b"\0", b" ").decode(errors="replace")


@pytest.fixture(scope="module")
def roles(live: LiveStack) -> Roles:
    return Roles(live)


@pytest.fixture(scope="module")
def operator_run(roles: Roles) -> dict[str, Any]:
    """A short retrain of digits triggered by the operator, run to its end.

    The command lines of the stack's processes are sampled while it runs, so those of the task
    processes (which hold the MLflow service account's password in their environment) are seen.
    """
    unpause_and_cancel_the_missed_slot(roles.live.api, DIGITS)
    run = roles.operator.trigger(DIGITS, SHORT_CONF)
    run_id = run["dag_run_id"]
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while (state := roles.live.api.run(DIGITS, run_id)["state"]) not in ("success", "failed"):
        assert time.monotonic() < deadline, f"{DIGITS} {run_id} still {state}"
        roles.sample_cmdlines()
        time.sleep(1)
    return roles.live.api.run(DIGITS, run_id)


# ----- anonymous ---------------------------------------------------------------------------


def test_anonymous_requests_get_401_from_both_servers(live: LiveStack) -> None:
    airflow = httpx.get(f"{live.api_url}/api/v2/dags", timeout=30)
    assert airflow.status_code == 401, airflow.text
    mlflow_api = httpx.get(
        f"{live.mlflow_uri}/api/2.0/mlflow/experiments/search",
        params={"max_results": 1},
        timeout=30,
    )
    assert mlflow_api.status_code == 401, mlflow_api.text
    ui = httpx.get(f"{live.mlflow_uri}/", timeout=30)
    assert ui.status_code == 401, f"the MLflow UI answered {ui.status_code} anonymously"
    wrong = httpx.get(
        f"{live.mlflow_uri}/api/2.0/mlflow/experiments/search",
        params={"max_results": 1},
        auth=(MLFLOW_ADMIN_USER, "not-the-password"),
        timeout=30,
    )
    assert wrong.status_code == 401, wrong.text


# ----- Airflow roles ---------------------------------------------------------------------------


def test_a_viewer_reads_but_cannot_trigger_clear_or_pause(roles: Roles) -> None:
    # Run ids, not whole runs: a run still going on changes (its last scheduling decision).
    runs_before = [run["dag_run_id"] for run in roles.live.api.runs(DIGITS)]
    paused_before = roles.live.api.dag(DIGITS)["is_paused"]
    assert DIGITS in {d["dag_id"] for d in roles.viewer.request("GET", "/api/v2/dags")["dags"]}
    with pytest.raises(AirflowApiError) as trigger:
        roles.viewer.trigger(DIGITS, SHORT_CONF)
    assert trigger.value.status_code == 403, trigger.value
    with pytest.raises(AirflowApiError) as clear:
        roles.viewer.request(
            "POST", f"/api/v2/dags/{DIGITS}/clearTaskInstances", json={"dry_run": True}
        )
    assert clear.value.status_code == 403, clear.value
    with pytest.raises(AirflowApiError) as pause:
        roles.viewer.set_paused(DIGITS, not paused_before)
    assert pause.value.status_code == 403, pause.value
    runs_after = [run["dag_run_id"] for run in roles.live.api.runs(DIGITS)]
    assert runs_after == runs_before, "the viewer's trigger created a run"
    assert roles.live.api.dag(DIGITS)["is_paused"] == paused_before


def test_an_operator_cannot_manage_users(roles: Roles) -> None:
    with pytest.raises(AirflowApiError) as refused:
        roles.operator.request(
            "POST",
            "/auth/fab/v1/users",
            json={
                "username": "intruder",
                "email": "intruder@example.com",
                "first_name": "in",
                "last_name": "truder",
                "roles": [{"name": "Admin"}],
                "password": _password(),
            },
        )
    assert refused.value.status_code == 403, refused.value


def test_an_operators_trigger_runs_to_success_and_it_may_clear(
    roles: Roles, operator_run: dict[str, Any]
) -> None:
    states = {
        t["task_id"]: t["state"]
        for t in roles.live.api.task_instances(DIGITS, operator_run["dag_run_id"])
    }
    assert operator_run["state"] == "success", states
    assert operator_run["conf"] == SHORT_CONF
    cleared = roles.operator.request(
        "POST",
        f"/api/v2/dags/{DIGITS}/clearTaskInstances",
        json={
            "dry_run": True,
            "only_failed": False,
            "dag_run_id": operator_run["dag_run_id"],
        },
    )
    assert cleared["task_instances"], "the operator's clear (dry run) matched no task"


# ----- MLflow ----------------------------------------------------------------------------------


def _mlflow_run(roles: Roles, airflow_run_id: str) -> Any:
    client = roles.live.mlflow()
    experiment = client.get_experiment_by_name(EXPERIMENT)
    (run,) = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`airflow.run_id` = '{airflow_run_id}'"
    )
    return run


def test_the_retrain_logs_and_registers_through_the_service_account(
    roles: Roles, operator_run: dict[str, Any]
) -> None:
    run = _mlflow_run(roles, operator_run["dag_run_id"])
    assert run.info.status == "FINISHED"
    version = run.data.tags[names.VERSION_TAG]
    registered = roles.live.mlflow().get_model_version(MODEL, version)
    assert registered.run_id == run.info.run_id
    # MLflow makes the creator of an experiment or registered model its manager: the account
    # created both, and the tasks hold no other credentials.
    assert roles.permission(MLFLOW_SERVICE_USER, "experiment", run.info.experiment_id) == "MANAGE"
    assert roles.permission(MLFLOW_SERVICE_USER, "registered_model", MODEL) == "MANAGE"
    # Everyone else only reads them.
    assert roles.permission("reader", "experiment", run.info.experiment_id) == "READ"
    assert roles.permission("reader", "registered_model", MODEL) == "READ"


def _registry(roles: Roles) -> dict[str, Any]:
    model = roles.mlflow_as_admin(
        "GET", "/api/2.0/mlflow/registered-models/get", params={"name": MODEL}
    )["registered_model"]
    versions = roles.mlflow_as_admin(
        "GET", "/api/2.0/mlflow/model-versions/search", params={"filter": f"name='{MODEL}'"}
    ).get("model_versions", [])
    return {
        "aliases": sorted((a["alias"], a["version"]) for a in model.get("aliases", [])),
        "versions": sorted(v["version"] for v in versions),
    }


def test_a_user_without_write_permission_cannot_move_champion_delete_or_register(
    roles: Roles, operator_run: dict[str, Any]
) -> None:
    run = _mlflow_run(roles, operator_run["dag_run_id"])
    version = run.data.tags[names.VERSION_TAG]
    before = _registry(roles)
    with httpx.Client(base_url=roles.config.mlflow_uri, auth=roles.reader, timeout=30) as reader:
        # It reads.
        assert (
            reader.get("/api/2.0/mlflow/runs/get", params={"run_id": run.info.run_id}).status_code
            == 200
        )
        attempts = {
            "set champion": reader.post(
                "/api/2.0/mlflow/registered-models/alias",
                json={"name": MODEL, "alias": "champion", "version": version},
            ),
            "delete the run": reader.post(
                "/api/2.0/mlflow/runs/delete", json={"run_id": run.info.run_id}
            ),
            "register a version": reader.post(
                "/api/2.0/mlflow/model-versions/create",
                json={
                    "name": MODEL,
                    "source": f"runs:/{run.info.run_id}/model",
                    "run_id": run.info.run_id,
                },
            ),
        }
    for what, answer in attempts.items():
        assert answer.status_code == 403, f"{what}: HTTP {answer.status_code} {answer.text}"
    assert _registry(roles) == before, "the registry changed"
    assert roles.live.mlflow().get_run(run.info.run_id).info.lifecycle_stage == "active"


def _compare(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    stratoflow = Path(sys.executable).parent / "stratoflow"
    return subprocess.run(
        [str(stratoflow), "compare", "digits"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_compare_runs_with_credentials_from_the_environment(
    roles: Roles, operator_run: dict[str, Any]
) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")},
        "MLFLOW_TRACKING_URI": roles.config.mlflow_uri,
    }
    reader = {
        **env,
        "MLFLOW_TRACKING_USERNAME": "reader",
        "MLFLOW_TRACKING_PASSWORD": roles.passwords["reader"],
    }
    compared = _compare(reader)
    assert compared.returncode == 0, compared.stderr[-3000:]
    run = _mlflow_run(roles, operator_run["dag_run_id"])
    (link,) = [
        line.split(": ", 1)[1]
        for line in compared.stdout.splitlines()
        if line.startswith("compare them in the MLflow UI: ")
    ]
    assert link.startswith(roles.config.mlflow_uri) and run.info.run_id in link, link
    page = link.split("#", 1)[0]  # the fragment is the UI's route, never sent to the server
    assert httpx.get(page, auth=roles.reader, timeout=30).status_code == 200, page
    assert httpx.get(page, timeout=30).status_code == 401, page
    # Without credentials: no table, a failure.
    refused = _compare(env)
    assert refused.returncode != 0, refused.stdout[-2000:]
    assert run.info.run_id not in refused.stdout


def test_serve_model_reads_the_model_with_credentials_from_the_environment(
    roles: Roles, operator_run: dict[str, Any], tmp_path: Path
) -> None:
    """`stratoflow serve-model` on the authenticated MLflow server: refused in seconds without
    credentials, naming the variables to set; served as a user who may only read; and the
    scoring server holds none of that user's password (only the command that fetched it)."""
    assert operator_run["state"] == "success", operator_run
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")},
        "MLFLOW_TRACKING_URI": roles.config.mlflow_uri,
        "TMPDIR": str(private_tmp),
    }
    command = [str(STRATOFLOW), "serve-model", "digits", "--alias", "challenger", "--port", "0"]
    refused = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert refused.returncode == 1, refused.stdout + refused.stderr[-3000:]
    assert f"MLflow at {roles.config.mlflow_uri} refused registered model {MODEL!r}" in (
        refused.stderr
    ), refused.stderr[-3000:]
    assert "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" in refused.stderr
    assert "Serving" not in refused.stdout

    password = roles.passwords["reader"]
    reader = {**env, "MLFLOW_TRACKING_USERNAME": "reader", "MLFLOW_TRACKING_PASSWORD": password}
    server = ServeModel(
        "digits", "--alias", "challenger", env=reader, log=tmp_path / "serve-model.log"
    )
    try:
        server.wait_until_serving()
        answer = json.loads(subprocess.check_output(server.example_curl(), timeout=60))
        assert set(answer["predictions"][0]) == {
            *(f"probability_{digit}" for digit in range(10)),
            "predicted_class",
            "predicted_class_id",
        }
        processes = server.tree()
        assert processes, server.tail()
        for process in processes:
            assert password not in " ".join(process.cmdline()), process.cmdline()
            assert password not in json.dumps(process.environ()), process.cmdline()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 143, server.tail()
        gone, alive = psutil.wait_procs(processes, timeout=5)
        assert not alive, [process.cmdline() for process in alive]
        assert not list(private_tmp.iterdir())
    finally:
        server.kill()


# ----- no password where others can read it --------------------------------------------------


def test_no_password_in_a_command_line_a_task_log_or_an_mlflow_param(
    roles: Roles, operator_run: dict[str, Any]
) -> None:
    passwords = roles.every_password()
    roles.sample_cmdlines()
    assert len(roles.cmdlines) > 20, "too few processes sampled"
    for pid, line in roles.cmdlines.items():
        leaked = [name for name, value in passwords.items() if value in line]
        assert not leaked, f"pid {pid} shows {leaked} in its command line: {line[:200]}"
    run_id = operator_run["dag_run_id"]
    for task in roles.live.api.task_instances(DIGITS, run_id):
        text = roles.live.api.task_log(DIGITS, run_id, task["task_id"], task["try_number"])
        leaked = [name for name, value in passwords.items() if value in text]
        assert not leaked, f"{task['task_id']}'s log shows {leaked}"
    run = _mlflow_run(roles, run_id)
    assert run.data.params, "the run logged no params"
    values = json.dumps(run.data.params) + json.dumps(run.data.tags)
    leaked = [name for name, value in passwords.items() if value in values]
    assert not leaked, f"the MLflow run's params or tags show {leaked}"
