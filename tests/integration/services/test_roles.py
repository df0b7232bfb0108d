"""Who may do what on the live services stack: Airflow's roles and MLflow's permissions.

Through the servers' real APIs (Airflow REST API v2 and the FAB auth manager's user API, MLflow's
REST API and MlflowClient), on the package's shared stack (conftest.py):

- anonymous requests get 401 from both servers;
- an Airflow viewer reads but its trigger, clear and pause get 403 and change nothing; an
  operator's trigger runs to success, and its clear is accepted;
- that run logs and registers in MLflow through the tasks' service account, and says who made
  it (the account as its user, the operator in `airflow.triggered_by`);
- every pipeline's experiment and registered model belong to that account from the start: a
  user without grants cannot take them; a name someone took before the claim is reported with
  its owner at start-up, and a run of that pipeline fails in its first task, without retry;
- an MLflow user without a grant reads, runs `stratoflow compare` and `stratoflow serve-model`
  (both refused without credentials), but setting `champion`, deleting a run and registering a
  version get 403, and the registry is unchanged;
- a user an admin deletes (REST) or deactivates (the FAB UI's user form) is refused at the next
  request with the token they already hold, and their trigger creates no run;
- wrong passwords for one login are refused with 429 after a few, the right one too while it
  lasts, and other users still sign in;
- no password is in a process's command line, a task log or an MLflow param.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from stratoflow.config import names
from stratoflow.config.assets import loadable_specs
from stratoflow.config.spec import load_spec
from stratoflow.services.airflow_api import AirflowApi, AirflowApiError
from stratoflow.services.config import ADMIN_USER, MLFLOW_ADMIN_USER, MLFLOW_SERVICE_USER
from tests.integration.services.stack import (
    LiveStack,
    add_airflow_user,
    unpause_and_cancel_the_missed_slot,
)
from tests.support.processes import STRATOFLOW, ServeModel

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)

DIGITS = "retrain_digits"
MODEL = "stratoflow-digits"
EXPERIMENT = names.experiment_name("digits")
# A short retrain: one epoch of the default strategy.
SHORT_CONF = {"epochs": 1}
RUN_TIMEOUT_S = 900
# Run by no other test of this stack: its names are taken by another user here.
SQUATTED = "diabetes"


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
            self.add_airflow_user(username, role)
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

    def add_airflow_user(self, username: str, role: str) -> str:
        """Create an Airflow user with `role` as the admin does (FAB's user API); its password."""
        password = self.passwords.setdefault(username, _password())
        return add_airflow_user(self.live.api, username, role, password)

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


# ----- removing a user, guessing a password ----------------------------------------------------


def _login(live: LiveStack, username: str, password: str) -> httpx.Response:
    """`POST /auth/token`, as a script signs in."""
    return httpx.post(
        f"{live.api_url}/auth/token",
        json={"username": username, "password": password},
        timeout=30,
    )


class _FormFields(HTMLParser):
    """What a browser submits from a page's forms: named inputs (ticked boxes only) and selected
    options, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, list[str]] = {}
        self._select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        name = attributes.get("name")
        if tag == "input" and name:
            if attributes.get("type") == "checkbox" and "checked" not in attributes:
                return
            self.fields.setdefault(name, []).append(attributes.get("value") or "")
        elif tag == "select":
            self._select = name
        elif tag == "option" and self._select and "selected" in attributes:
            self.fields.setdefault(self._select, []).append(attributes.get("value") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self._select = None


def _form_fields(page: str) -> dict[str, list[str]]:
    parser = _FormFields()
    parser.feed(page)
    return parser.fields


def _deactivate_in_the_fab_ui(live: LiveStack, username: str) -> None:
    """What an admin does in Security > List Users: open the user, untick "Is Active", save.

    FAB's REST API has no field for it (`PATCH /auth/fab/v1/users/{name}` refuses `active`
    with 422), so this goes through the auth manager's own pages, signed in with its form.
    """
    assert live.stack.config is not None
    with httpx.Client(base_url=live.api_url, timeout=30) as browser:
        login = _form_fields(browser.get("/auth/login/").text)
        login |= {"username": [ADMIN_USER], "password": [live.stack.config.admin_password]}
        signed_in = browser.post("/auth/login/", data=login)
        assert signed_in.status_code == 302, f"UI sign-in: HTTP {signed_in.status_code}"
        assert "/login" not in signed_in.headers["location"], "the admin's UI sign-in failed"
        listing = browser.get("/auth/users/list/", params={"_flt_0_username": username})
        (user_id,) = set(re.findall(r"/auth/users/edit/(\d+)", listing.text))
        form = _form_fields(browser.get(f"/auth/users/edit/{user_id}").text)
        assert form.pop("active") == ["y"], "the user was not active"
        saved = browser.post(f"/auth/users/edit/{user_id}", data=form)
        assert saved.status_code == 302, f"saving the user form: HTTP {saved.status_code}"


@pytest.mark.parametrize("removal", ["deleted", "deactivated"])
def test_a_removed_user_is_refused_at_the_next_request_with_the_token_they_hold(
    roles: Roles, removal: str
) -> None:
    live = roles.live
    username = f"leaver-{removal}"
    answer = _login(live, username, roles.add_airflow_user(username, "Op"))
    assert answer.status_code == 201, answer.text
    bearer = {"Authorization": f"Bearer {answer.json()['access_token']}"}
    dag = f"{live.api_url}/api/v2/dags/{DIGITS}"
    # The token works, and the auth manager has now met its user (and may remember it).
    assert httpx.get(dag, headers=bearer, timeout=30).status_code == 200
    runs_before = {run["dag_run_id"] for run in live.api.runs(DIGITS)}
    if removal == "deleted":
        live.api.request("DELETE", f"/auth/fab/v1/users/{username}")
    else:
        _deactivate_in_the_fab_ui(live, username)
        assert live.api.request("GET", f"/auth/fab/v1/users/{username}")["active"] is False
    trigger = httpx.post(
        f"{dag}/dagRuns",
        json={"logical_date": None, "conf": SHORT_CONF},
        headers=bearer,
        timeout=30,
    )
    read = httpx.get(dag, headers=bearer, timeout=30)
    created = [r["dag_run_id"] for r in live.api.runs(DIGITS) if r["dag_run_id"] not in runs_before]
    assert trigger.status_code in (401, 403), (
        f"the {removal} user's trigger right after: HTTP {trigger.status_code}, runs {created}"
    )
    assert read.status_code in (401, 403), f"the {removal} user read: HTTP {read.status_code}"
    assert created == []


def test_wrong_passwords_for_a_login_get_429_and_then_so_does_the_right_one(roles: Roles) -> None:
    """Ten wrong passwords sent at once: as many as the limit allows are checked (401), the rest
    refused (429) however they race; then the right password is refused too."""
    from limits import parse

    from stratoflow.services.login_limit import FAILURES_PER_LOGIN

    live = roles.live
    password = roles.add_airflow_user("guessed", "Viewer")
    with ThreadPoolExecutor(max_workers=10) as pool:
        answers = list(pool.map(lambda n: _login(live, "guessed", f"guess-{n}"), range(10)))
    codes = sorted(answer.status_code for answer in answers)
    assert 429 in codes, f"10 wrong passwords at once, answered {codes}"
    assert codes.count(401) == parse(FAILURES_PER_LOGIN).amount, codes
    retry_after = int(next(a for a in answers if a.status_code == 429).headers["Retry-After"])
    assert 0 < retry_after <= 60, retry_after
    right = _login(live, "guessed", password)
    assert right.status_code == 429, f"the right password while refused: HTTP {right.status_code}"
    # The limit holds that login, not everyone's: the admin still signs in.
    assert live.stack.config is not None
    assert _login(live, ADMIN_USER, live.stack.config.admin_password).status_code == 201
    log.info("roles: 10 wrong passwords at once: %s (Retry-After %d s)", codes, retry_after)


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
    # The run says who made it: the account it logs as, and the Airflow user who triggered it.
    assert run.info.user_id == MLFLOW_SERVICE_USER
    assert run.data.tags["airflow.triggered_by"] == "operator"
    # MLflow makes the creator of an experiment or registered model its manager: the account
    # created both, and the tasks hold no other credentials.
    assert roles.permission(MLFLOW_SERVICE_USER, "experiment", run.info.experiment_id) == "MANAGE"
    assert roles.permission(MLFLOW_SERVICE_USER, "registered_model", MODEL) == "MANAGE"
    # Everyone else only reads them.
    assert roles.permission("reader", "experiment", run.info.experiment_id) == "READ"
    assert roles.permission("reader", "registered_model", MODEL) == "READ"


def test_every_pipelines_names_belong_to_the_service_account_from_the_start(
    roles: Roles,
) -> None:
    """`up` claimed each discovered pipeline's experiment and registered model for the account,
    before any run: a user without grants cannot create them, and may only read them."""
    mlflow = roles.live.mlflow()
    specs = loadable_specs()
    assert SQUATTED in {spec.name for spec in specs}
    with httpx.Client(base_url=roles.config.mlflow_uri, auth=roles.reader, timeout=30) as reader:
        for spec in specs:
            experiment = names.experiment_name(spec.name)
            attempts = {
                experiment: reader.post(
                    "/api/2.0/mlflow/experiments/create", json={"name": experiment}
                ),
                spec.registered_model: reader.post(
                    "/api/2.0/mlflow/registered-models/create",
                    json={"name": spec.registered_model},
                ),
            }
            for name, answer in attempts.items():
                assert answer.status_code == 400 and "RESOURCE_ALREADY_EXISTS" in answer.text, (
                    f"a user without grants could create {name}: HTTP {answer.status_code} "
                    f"{answer.text[:300]}"
                )
            experiment_id = mlflow.get_experiment_by_name(experiment).experiment_id
            for user, expected in ((MLFLOW_SERVICE_USER, "MANAGE"), ("reader", "READ")):
                assert roles.permission(user, "experiment", experiment_id) == expected, experiment
                assert (
                    roles.permission(user, "registered_model", spec.registered_model) == expected
                ), spec.registered_model


def _claim_as_the_deployment_does(roles: Roles) -> subprocess.CompletedProcess[str]:
    """What every start runs (the stack's `up`, compose's mlflow-init), with the stack's
    secrets in its environment."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")},
        "MLFLOW_TRACKING_URI": roles.config.mlflow_uri,
        "MLFLOW_AUTH_ADMIN_USERNAME": MLFLOW_ADMIN_USER,
        "MLFLOW_AUTH_ADMIN_PASSWORD": roles.config.mlflow_admin_password,
        "MLFLOW_SERVICE_USERNAME": MLFLOW_SERVICE_USER,
        "MLFLOW_SERVICE_PASSWORD": roles.config.mlflow_service_password,
    }
    return subprocess.run(
        [sys.executable, "-m", "stratoflow.services.mlflow_auth", "service-account"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_a_name_taken_before_the_claim_is_reported_and_refuses_the_run_at_once(
    roles: Roles,
) -> None:
    """Another user took both names first (here: after the claim freed them again, as on a
    server where someone was faster): the claim names the owner and the fix, and a run of the
    pipeline fails in its first task, without retry, before it prepares data or trains. Once the
    owner's account is gone, the next claim takes the names; a deleted experiment is reported."""
    spec = load_spec(SQUATTED)
    experiment, model = names.experiment_name(SQUATTED), spec.registered_model
    dag_id = names.retrain_dag_id(SQUATTED)
    mlflow = roles.live.mlflow()
    # Free both names again (the claimed experiment renamed away, the claimed model deleted).
    claimed = mlflow.get_experiment_by_name(experiment)
    if claimed is not None:
        roles.mlflow_as_admin(
            "POST",
            "/api/2.0/mlflow/experiments/update",
            json={"experiment_id": claimed.experiment_id, "new_name": f"{experiment}-claimed"},
        )
    deleted = httpx.request(
        "DELETE",
        f"{roles.config.mlflow_uri}/api/2.0/mlflow/registered-models/delete",
        json={"name": model},
        auth=roles.mlflow_admin,
        timeout=30,
    )
    assert deleted.status_code in (200, 404), deleted.text
    squatter = ("squatter", _password())
    roles.mlflow_as_admin(
        "POST",
        "/api/2.0/mlflow/users/create",
        json={"username": squatter[0], "password": squatter[1]},
    )
    with httpx.Client(base_url=roles.config.mlflow_uri, auth=squatter, timeout=30) as http:
        taken = http.post("/api/2.0/mlflow/experiments/create", json={"name": experiment})
        assert taken.status_code == 200, taken.text
        assert (
            http.post("/api/2.0/mlflow/registered-models/create", json={"name": model}).status_code
            == 200
        )
    squatted_id = taken.json()["experiment_id"]

    for line in _claimed_lines(roles, experiment, model):
        assert "owned by squatter" in line and "MANAGE" in line, line
        assert MLFLOW_SERVICE_USER in line, line
    assert roles.permission(MLFLOW_SERVICE_USER, "experiment", squatted_id) == "READ"

    unpause_and_cancel_the_missed_slot(roles.live.api, dag_id)
    run_id = roles.live.api.trigger(dag_id, SHORT_CONF)["dag_run_id"]
    run = roles.live.api.wait_for_run(dag_id, run_id, timeout_seconds=RUN_TIMEOUT_S)
    states = {t["task_id"]: t["state"] for t in roles.live.api.task_instances(dag_id, run_id)}
    assert run["state"] == "failed", states
    prepare = roles.live.api.task_instance(dag_id, run_id, names.PREPARE_TASK)
    assert (prepare["state"], prepare["try_number"]) == ("failed", 1), "it was retried"
    assert states[names.TRAIN_TASK] == "upstream_failed"
    log = roles.live.api.task_log(dag_id, run_id, names.PREPARE_TASK, 1)
    # The log shows the message inside the exception's repr: no quotes to match on.
    expected = (experiment, model, "owned by another MLflow user", "MANAGE", MLFLOW_SERVICE_USER)
    for text in (*expected, "not retried"):
        assert text in log, f"{text!r} not in the log:\n{log[-3000:]}"
    assert not mlflow.search_runs([squatted_id]), "the run logged into the other user's experiment"

    # The owner's account is deleted: the names have no owner, and the next claim takes them.
    roles.mlflow_as_admin("DELETE", "/api/2.0/mlflow/users/delete", json={"username": squatter[0]})
    report = _claimed_lines(roles, experiment, model)
    for line in report:
        assert f"had no owner: MANAGE granted to {MLFLOW_SERVICE_USER}" in line, line
    assert roles.permission(MLFLOW_SERVICE_USER, "experiment", squatted_id) == "MANAGE"
    assert roles.permission(MLFLOW_SERVICE_USER, "registered_model", model) == "MANAGE"
    # A deleted experiment keeps its name: reported, with how an admin frees or restores it.
    roles.mlflow_as_admin(
        "POST", "/api/2.0/mlflow/experiments/delete", json={"experiment_id": squatted_id}
    )
    (line,) = _claimed_lines(roles, experiment)
    assert "is deleted" in line and "mlflow gc" in line and "experiments/restore" in line, line
    roles.mlflow_as_admin(
        "POST", "/api/2.0/mlflow/experiments/restore", json={"experiment_id": squatted_id}
    )


def _claimed_lines(roles: Roles, *names_claimed: str) -> list[str]:
    """The deployment's claim, run again: its line about each of `names_claimed`."""
    claim = _claim_as_the_deployment_does(roles)
    assert claim.returncode == 0, claim.stderr[-3000:]
    report = (claim.stdout + claim.stderr).splitlines()
    lines = []
    for name in names_claimed:
        found = [line for line in report if f"'{name}'" in line]
        assert len(found) == 1, f"the claim reports {name!r} {len(found)} times:\n{report}"
        lines += found
    return lines


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
