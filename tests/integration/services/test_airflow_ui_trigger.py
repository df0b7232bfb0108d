"""Manual triggers from the Airflow UI, in headless Chromium, against the real services stack.

A user signs in to the api-server of a services stack (`stratoflow.services`), opens the trigger
form of a DAG and presses Trigger. Every Param's default must make a valid form (Trigger enabled,
no error on "Run Parameters"), for every retrain and benchmark DAG. Two runs are triggered
through the form and must succeed, training under the strategy the form showed: an image
pipeline's with the defaults, and a tabular pipeline's with another strategy picked from the
dropdown and fewer epochs typed in.

One stack serves the package (`live`, in this package's conftest.py). A screenshot of each
failure lands in a temporary folder whose path the failure message gives.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from stratoflow.config import names
from stratoflow.config.params import dag_params
from stratoflow.config.spec import list_pipelines, load_spec
from stratoflow.services.config import ADMIN_USER
from tests.integration.services.stack import LiveStack, unpause_and_cancel_the_missed_slot
from tests.integration.test_mlflow_ui_browser import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.integration
log = logging.getLogger(__name__)

PIPELINES = list_pipelines()
RETRAIN_DAGS = [names.retrain_dag_id(pipeline) for pipeline in PIPELINES]
# Strategy benchmarks exist for classification pipelines only
# (stratoflow/dags/benchmark_strategies.py).
BENCHMARK_DAGS = [
    names.benchmark_dag_id(pipeline)
    for pipeline in PIPELINES
    if load_spec(pipeline).task == "classification"
]
# Triggered from the form and run: an image pipeline with the form as it opens, a tabular one
# with a strategy picked and epochs typed. Every form is built by the same `dag_params` and every
# form's validity is checked above, so each way of filling it is run once, not once per pipeline:
# each run costs this package's one stack about a minute of both cores (mnist's REST-triggered
# run is in test_services_stack.py).
DEFAULTS_RUN_PIPELINE = "digits"
PICKED_RUN_PIPELINE = "penguins"
UI_RUN_PIPELINES = [DEFAULTS_RUN_PIPELINE, PICKED_RUN_PIPELINE]
OTHER_STRATEGY = "mirrored"  # picked from the dropdown for the tabular run
OTHER_EPOCHS = 2  # typed into the form for the tabular run
PAGE_TIMEOUT_MS = 120_000  # the UI's first load on a busy 2-core machine
RUN_TIMEOUT_S = 900
REQUIRED_ERROR = "This field is required"  # the form's message for an empty required field


@dataclass
class Ui:
    """A signed-in browser page on the stack's Airflow UI."""

    page: Any
    base_url: str
    shots: Path

    @contextlib.contextmanager
    def screenshot_on_failure(self, name: str) -> Iterator[None]:
        """Save a screenshot named `name` when the block fails, and name it in the failure."""
        try:
            yield
        except BaseException as error:
            path = self.shots / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.png"
            with contextlib.suppress(Exception):
                self.page.screenshot(path=str(path), full_page=True)
            raise AssertionError(f"{error}\n(screenshot of the page: {path})") from error

    def open_trigger_form(self, dag_id: str) -> Any:
        """Open the DAG's page, press its Trigger button; the form's dialog, rendered."""
        self.page.goto(f"{self.base_url}/dags/{dag_id}")
        self.page.get_by_role("button", name="Trigger").first.click()
        dialog = self.page.get_by_role("dialog")
        # The section and its fields render once the DAG's Params have loaded.
        dialog.get_by_role("button", name="Run Parameters").wait_for()
        dialog.locator("[id^='element_']").first.wait_for(state="attached")
        self.page.wait_for_timeout(1000)  # the form validates its values in an effect
        return dialog


def form_problems(dialog: Any) -> list[str]:
    """What makes the form refuse to trigger: a disabled Trigger button, or an error shown."""
    problems = []
    if not dialog.get_by_role("button", name="Trigger", exact=True).is_enabled():
        problems.append("the Trigger button is disabled")
    # An invalid field puts an error icon beside the section's title (the chevron is apart).
    section = dialog.get_by_role("button", name="Run Parameters")
    if section.locator(".chakra-stack svg").count():
        problems.append('"Run Parameters" shows an error')
    required = dialog.get_by_text(REQUIRED_ERROR)
    if required.count():
        problems.append(f"{required.count()} field(s) say {REQUIRED_ERROR!r}")
    return problems


def sign_in(page: Any, base_url: str, username: str, password: str) -> None:
    """Sign in to the Airflow UI at `base_url` on `page`, as a user does."""
    page.goto(f"{base_url}/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/auth/" not in url)


@contextlib.contextmanager
def signed_in(live: LiveStack, username: str, password: str, shots_prefix: str) -> Iterator[Ui]:
    """Chromium, signed in to the stack's Airflow UI as `username`, as a user does."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"Chromium is not installed at {CHROMIUM}: `apt-get install -y chromium`")
    from playwright.sync_api import sync_playwright

    shots = Path(tempfile.mkdtemp(prefix=shots_prefix))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(PAGE_TIMEOUT_MS)
            session = Ui(page, live.api_url, shots)
            with session.screenshot_on_failure("sign-in"):
                sign_in(page, live.api_url, username, password)
            yield session
        finally:
            browser.close()
    if not any(shots.iterdir()):
        shutil.rmtree(shots, ignore_errors=True)


@pytest.fixture(scope="module")
def ui(live: LiveStack) -> Iterator[Ui]:
    """Chromium, signed in to the stack's Airflow UI as the admin."""
    assert live.stack.config is not None
    with signed_in(live, ADMIN_USER, live.stack.config.admin_password, "airflow-ui-trigger-") as ui:
        yield ui


@pytest.mark.parametrize("dag_id", RETRAIN_DAGS + BENCHMARK_DAGS)
def test_the_trigger_form_is_valid_with_the_defaults(ui: Ui, dag_id: str) -> None:
    with ui.screenshot_on_failure(f"form-{dag_id}"):
        dialog = ui.open_trigger_form(dag_id)
        assert form_problems(dialog) == []
    ui.page.keyboard.press("Escape")


@dataclass
class UiRun:
    """A run the form triggered, and the strategy the form showed."""

    run_id: str
    strategy: str


@pytest.fixture(scope="module")
def ui_runs(ui: Ui, live: LiveStack) -> dict[str, UiRun]:
    """Pipeline → its run: `DEFAULTS_RUN_PIPELINE`'s with the defaults, the other's picked.

    Both are triggered before either is awaited: the stack runs two DAG runs at a time.
    """
    runs = {}
    for pipeline in UI_RUN_PIPELINES:
        dag_id = names.retrain_dag_id(pipeline)
        # Unpausing runs the cron's latest slot at once; it would hold the DAG's only run slot.
        unpause_and_cancel_the_missed_slot(live.api, dag_id)
        default = load_spec(pipeline).training.strategy
        assert default != OTHER_STRATEGY
        strategy = default if pipeline == DEFAULTS_RUN_PIPELINE else OTHER_STRATEGY
        with ui.screenshot_on_failure(f"trigger-{dag_id}-{strategy}"):
            runs[pipeline] = UiRun(_trigger_from_the_form(ui, dag_id, strategy, default), strategy)
    return runs


def _trigger_from_the_form(ui: Ui, dag_id: str, strategy: str, default: str) -> str:
    dialog = ui.open_trigger_form(dag_id)
    assert form_problems(dialog) == [], f"{dag_id}: the form refuses its defaults"
    if strategy != default:
        dialog.locator("#element_strategy").click()
        ui.page.get_by_role("option", name=re.compile(f"^{strategy}:")).click()
        # The field's text: react-select's announcement for screen readers, then the value.
        shown = dialog.locator("#element_strategy").inner_text().splitlines()[-1]
        assert shown.startswith(f"{strategy}:"), shown
        dialog.locator("input[name='element_epochs']").fill(str(OTHER_EPOCHS))
        assert form_problems(dialog) == []
    dialog.get_by_role("button", name="Trigger", exact=True).click()
    # The UI opens the new run's page: its URL names the run.
    ui.page.wait_for_url(re.compile(rf"/dags/{dag_id}/runs/[^/]+$"))
    run_id = unquote(ui.page.url.rsplit("/runs/", 1)[1])
    log.info("%s: triggered %s from the form (%s)", dag_id, run_id, strategy)
    return run_id


@pytest.mark.parametrize("pipeline", UI_RUN_PIPELINES)
def test_runs_triggered_from_the_form_succeed_under_the_chosen_strategy(
    ui_runs: dict[str, UiRun], live: LiveStack, pipeline: str
) -> None:
    dag_id = names.retrain_dag_id(pipeline)
    spec = load_spec(pipeline)
    defaults = {key: kwargs["default"] for key, kwargs in dag_params(spec).items()}
    mlflow = live.mlflow()
    run_id, strategy = ui_runs[pipeline].run_id, ui_runs[pipeline].strategy
    run = live.api.wait_for_run(dag_id, run_id, timeout_seconds=RUN_TIMEOUT_S)
    # Looked up once the run has finished: its prepare_dataset creates it.
    experiment = mlflow.get_experiment_by_name(f"stratoflow/{pipeline}")
    tasks = {t["task_id"]: t["state"] for t in live.api.task_instances(dag_id, run_id)}
    assert run["state"] == "success", f"{run_id} ({strategy}): {run['state']}, tasks {tasks}"
    assert run["run_type"] == "manual"
    # The form sends every Param: the defaults, with what the user picked and typed.
    changed = {} if strategy == defaults["strategy"] else {"epochs": OTHER_EPOCHS}
    assert run["conf"] == {**defaults, "strategy": strategy, **changed}, run_id
    assert run["conf"]["cluster"] is None  # no standing cluster: local processes
    (mlflow_run,) = mlflow.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`airflow.run_id` = '{run_id}'"
    )
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.tags["strategy"] == strategy
    replicas = spec.training.replicas if strategy == OTHER_STRATEGY else 1
    assert mlflow_run.data.tags["num_replicas"] == str(replicas)
    assert mlflow_run.data.params["training.epochs"] == str(run["conf"]["epochs"])
