"""A person approves or rejects a promotion in the Airflow UI (headless Chromium), on the stack.

The test pipelines `digits_approval` and `digits_approval_timeout` (`tests/support/pipelines/`,
on the stack's pipeline path: this package's conftest.py) ask for approval before `champion`
moves. One run of `digits_approval` is approved and the next one rejected, each by an Op user
pressing the button under the run's "Required Action"; after each, the MLflow client reads
where `champion` is. A Viewer cannot answer: the API answers 403, and so it does when the Viewer
presses Approve in the UI (which says "Access Denied"). The timeout pipeline's run waits 5 s for
an answer that never comes: the scheduler answers "Reject" for it, and `champion` does not move.
The timeout run goes alongside the first approval run (the stack runs two tasks at a time; a
task awaiting input holds no slot).

One stack serves the package (`live`). A screenshot of each failure of the browser steps lands
in a temporary folder whose path the failure message gives.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest

from stratoflow.config import names
from stratoflow.config.promotion import APPROVE, REJECT
from stratoflow.config.spec import load_spec
from stratoflow.services.airflow_api import AirflowApi, AirflowApiError
from stratoflow.tasks import approve
from tests.integration.services.stack import LiveStack, add_airflow_user
from tests.integration.services.test_airflow_ui_trigger import (
    PAGE_TIMEOUT_MS,
    Ui,
    sign_in,
    signed_in,
)

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)

APPROVAL = "digits_approval"
TIMEOUT = "digits_approval_timeout"
RUN_TIMEOUT_S = 900
APPROVER = "approver"  # role Op
VIEWER = "approval-viewer"  # role Viewer


@pytest.fixture(scope="module")
def specs(live: LiveStack) -> dict[str, Any]:
    """The test pipelines' specs (`live` put them on this process's pipeline path too)."""
    del live
    return {name: load_spec(name) for name in (APPROVAL, TIMEOUT)}


@dataclass
class People:
    """The users who answer: passwords and REST clients, created by the admin."""

    passwords: dict[str, str]
    approver: AirflowApi
    viewer: AirflowApi


@pytest.fixture(scope="module")
def people(live: LiveStack) -> People:
    passwords = {
        user: add_airflow_user(live.api, user, role)
        for user, role in ((APPROVER, "Op"), (VIEWER, "Viewer"))
    }
    return People(
        passwords,
        AirflowApi(live.api_url, APPROVER, passwords[APPROVER]),
        AirflowApi(live.api_url, VIEWER, passwords[VIEWER]),
    )


@pytest.fixture(scope="module")
def ui(live: LiveStack, people: People) -> Iterator[Ui]:
    """Chromium, signed in to the stack's Airflow UI as the approver (role Op)."""
    with signed_in(live, APPROVER, people.passwords[APPROVER], "airflow-ui-approval-") as ui:
        yield ui


def _wait_for_task(live: LiveStack, dag_id: str, run_id: str, task_id: str, state: str) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        tasks = {t["task_id"]: t["state"] for t in live.api.task_instances(dag_id, run_id)}
        if tasks[task_id] == state:
            return
        run_state = live.api.run(dag_id, run_id)["state"]
        assert run_state in ("queued", "running"), f"{dag_id} {run_id}: {run_state} first"
        assert time.monotonic() < deadline, f"{dag_id} {run_id}: still {tasks}"
        time.sleep(2)


def _request_url(ui: Ui, dag_id: str, run_id: str) -> str:
    """The UI's page of the run's approval request ("Required Action")."""
    task = names.APPROVE_TASK
    return f"{ui.base_url}/dags/{dag_id}/runs/{quote(run_id)}/tasks/{task}/required_actions"


def _answer_in_the_ui(ui: Ui, dag_id: str, run_id: str, option: str) -> str:
    """Open the run's request, check what it shows, press `option`; the request's text."""
    ui.page.goto(_request_url(ui, dag_id, run_id))
    button = ui.page.get_by_test_id(f"hitl-option-{option}")
    button.wait_for()
    text = ui.page.locator("body").inner_text()
    button.click()
    # The answer is recorded: the buttons go (or are disabled) and the task resumes.
    ui.page.wait_for_function(
        f"!document.querySelector('[data-testid=\"hitl-option-{option}\"]:not([disabled])')"
    )
    return str(text)


def _finished(live: LiveStack, dag_id: str, run_id: str) -> dict[str, str]:
    run = live.api.wait_for_run(dag_id, run_id, timeout_seconds=RUN_TIMEOUT_S)
    tasks = {t["task_id"]: t["state"] for t in live.api.task_instances(dag_id, run_id)}
    assert run["state"] == "success", (
        f"{dag_id} {run_id}: {run['state']}, tasks {tasks}\n{_failed_logs(live, dag_id, run_id)}"
    )
    return tasks


def _failed_logs(live: LiveStack, dag_id: str, run_id: str) -> str:
    """The end of each failed task's log, and what the stack's services logged of the run, for a
    failure message (a task process that dies leaves the why in its supervisor's log, not its
    own)."""
    tails = []
    named = {run_id}  # the supervisor's lines name the task instance by its id
    for task in live.api.task_instances(dag_id, run_id):
        if task["state"] == "failed":
            named.add(str(task.get("id", run_id)))
            text = live.api.task_log(dag_id, run_id, task["task_id"], task["try_number"])
            tails.append(f"--- {task['task_id']} (try {task['try_number']}):\n{text[-4000:]}")
    assert live.stack.config is not None
    services = [
        f"{path.stem}: {line[:600]}"
        for path in sorted(live.stack.config.logs_dir.glob("*.log"))
        for line in path.read_text(errors="replace").splitlines()
        if any(name in line for name in named)
    ]
    tails.append(
        "--- the services' lines naming the run or a failed task:\n" + "\n".join(services[-40:])
    )
    return "\n".join(tails)


def _aliases(live: LiveStack, model: str) -> dict[str, str]:
    return {a: str(v) for a, v in live.mlflow().get_registered_model(model).aliases.items()}


def _registered_version(live: LiveStack, dag_id: str, run_id: str) -> str:
    return str(live.api.xcom(dag_id, run_id, names.REGISTER_TASK)["version"])


@dataclass
class Outcome:
    """A run that asked for approval: its id, its version, and `champion` once it ended."""

    run_id: str
    version: str
    champion: str | None
    shown: str  # what the request showed the approver


@dataclass
class ViewerAttempt:
    """A Viewer's tries to approve the first run: what the API and the UI answered."""

    subject: str  # of the request, as the Viewer reads it
    api_answer: str  # to the Viewer's PATCH
    ui_answer: str  # to the Viewer's press of Approve in the UI
    ui_message: str  # what the UI said then
    task_state: str  # of the request afterwards


@dataclass
class Approvals:
    approved: Outcome
    rejected: Outcome
    timed_out: Outcome
    viewer: ViewerAttempt


@pytest.fixture(scope="module")
def approvals(live: LiveStack, people: People, ui: Ui, specs: dict[str, Any]) -> Approvals:
    """Run `digits_approval` twice (approved, then rejected) and the timeout pipeline once."""
    approval, timeout = names.retrain_dag_id(APPROVAL), names.retrain_dag_id(TIMEOUT)
    model = specs[APPROVAL].registered_model
    for dag_id in (approval, timeout):
        live.api.set_paused(dag_id, False)  # no cron: unpausing starts no run
    timed_out = live.api.trigger(timeout, {})["dag_run_id"]
    outcomes: dict[str, Outcome] = {}
    viewer: ViewerAttempt | None = None
    for option in (APPROVE, REJECT):
        run_id = live.api.trigger(approval, {})["dag_run_id"]
        _wait_for_task(live, approval, run_id, names.APPROVE_TASK, "awaiting_input")
        if viewer is None:
            viewer = _viewer_tries_to_approve(live, people, ui, approval, run_id)
        with ui.screenshot_on_failure(f"{option}-{run_id}"):
            shown = _answer_in_the_ui(ui, approval, run_id, option)
        _finished(live, approval, run_id)
        version = _registered_version(live, approval, run_id)
        champion = _aliases(live, model).get(names.CHAMPION)
        outcomes[option] = Outcome(run_id, version, champion, shown)
        log.info("approval: %s run %s (version %s): champion %s", option, run_id, version, champion)
    tasks = _finished(live, timeout, timed_out)
    assert tasks[names.PROMOTE_TASK] == "success"
    assert viewer is not None
    return Approvals(
        approved=outcomes[APPROVE],
        rejected=outcomes[REJECT],
        timed_out=Outcome(
            timed_out,
            _registered_version(live, timeout, timed_out),
            _aliases(live, specs[TIMEOUT].registered_model).get(names.CHAMPION),
            "",
        ),
        viewer=viewer,
    )


def _viewer_tries_to_approve(
    live: LiveStack, people: People, ui: Ui, dag_id: str, run_id: str
) -> ViewerAttempt:
    """The Viewer reads the request, then tries to approve it through the API and in the UI
    (in a browser context of its own beside the approver's)."""
    path = (
        f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{names.APPROVE_TASK}/-1/hitlDetails"
    )
    shown = people.viewer.request("GET", path)
    try:
        people.viewer.request("PATCH", path, json={"chosen_options": [APPROVE], "params_input": {}})
        api_answer = "accepted"
    except AirflowApiError as error:
        api_answer = f"HTTP {error.status_code}"
    context = ui.page.context.browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        viewer = Ui(context.new_page(), ui.base_url, ui.shots)
        viewer.page.set_default_timeout(PAGE_TIMEOUT_MS)
        with viewer.screenshot_on_failure(f"viewer-{run_id}"):
            sign_in(viewer.page, ui.base_url, VIEWER, people.passwords[VIEWER])
            viewer.page.goto(_request_url(ui, dag_id, run_id))
            with viewer.page.expect_response(
                lambda answer: "hitlDetails" in answer.url and answer.request.method == "PATCH"
            ) as answer:
                viewer.page.get_by_test_id(f"hitl-option-{APPROVE}").click()
            message = viewer.page.get_by_text("You do not have permission")
            message.wait_for()
            ui_answer, ui_message = f"HTTP {answer.value.status}", message.inner_text()
    finally:
        context.close()
    state = live.api.task_instance(dag_id, run_id, names.APPROVE_TASK)["state"]
    return ViewerAttempt(str(shown["subject"]), api_answer, ui_answer, ui_message, str(state))


def test_a_viewer_sees_the_request_but_cannot_approve_it(approvals: Approvals) -> None:
    viewer = approvals.viewer
    assert viewer.subject.startswith("Promote stratoflow-digits-approval version ")
    assert (viewer.api_answer, viewer.ui_answer) == ("HTTP 403", "HTTP 403")
    assert viewer.ui_message == "You do not have permission to perform this action."
    assert viewer.task_state == "awaiting_input"  # the request still waits for a real answer


def test_an_approval_in_the_ui_moves_champion(
    live: LiveStack, approvals: Approvals, specs: dict[str, Any]
) -> None:
    approved = approvals.approved
    assert approved.champion == approved.version
    # The approver read the report: the gate and the metrics (no champion before the first).
    assert f"version {approved.version} to champion?" in approved.shown
    assert "Gate: passed" in approved.shown
    assert "Test metrics against the champion" in approved.shown
    tags = live.mlflow().get_model_version(specs[APPROVAL].registered_model, approved.version).tags
    assert tags[approve.DECISION_TAG] == "approved"
    assert tags[approve.RESPONDER_TAG] == APPROVER


def test_a_rejection_in_the_ui_leaves_champion_where_it_was(
    live: LiveStack, approvals: Approvals, specs: dict[str, Any]
) -> None:
    approved, rejected = approvals.approved, approvals.rejected
    assert rejected.version != approved.version
    assert rejected.champion == approved.version
    # The request compared the challenger with the champion of the time.
    assert f"champion is version {approved.version}" in rejected.shown
    model = specs[APPROVAL].registered_model
    assert _aliases(live, model)[names.CHALLENGER] == rejected.version
    version = live.mlflow().get_model_version(model, rejected.version)
    run = live.mlflow().get_run(version.run_id)
    for tags in (version.tags, run.data.tags):
        assert tags[approve.DECISION_TAG] == "rejected"
        assert tags[approve.NOTE_TAG] == (
            f"rejected by {APPROVER}: champion stays {approved.version}"
        )


def test_no_answer_before_the_timeout_leaves_champion_unset(
    live: LiveStack, approvals: Approvals, specs: dict[str, Any]
) -> None:
    timed_out = approvals.timed_out
    assert timed_out.champion is None
    model = specs[TIMEOUT].registered_model
    assert _aliases(live, model) == {names.CHALLENGER: timed_out.version}
    tags = live.mlflow().get_model_version(model, timed_out.version).tags
    assert tags[approve.DECISION_TAG] == "timed out"
    assert tags[approve.NOTE_TAG] == "no answer before the timeout: champion stays unset"
