"""Two real runs, one_device and mirrored, compared in a real MLflow UI in headless Chromium.

A real `mlflow server` (SQLite store in a temporary folder, artifacts proxied by the server), two
short digits trainings through the pipeline steps, `stratoflow compare --plot` against that
server, and the compare page it links to opened in Chromium (the Debian package, driven by
Playwright; `.ci/run` installs it). The screenshot is kept in `test-artifacts/`.
"""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from pathlib import Path

import pytest

from stratoflow.cli import main
from stratoflow.config import locations, names
from tests.support.images import colour_pixels, png_size
from tests.support.mlflow_server import mlflow_server as running_mlflow_server

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS_DIR = locations.PROJECT_ROOT / "test-artifacts"
PAGE_RENDER_MS = 120_000
STRATEGIES = ("one_device", "mirrored")


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """`mlflow server` on 127.0.0.1 and a free port; MLFLOW_TRACKING_URI points at it."""
    with (
        running_mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as url,
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.setenv(locations.TRACKING_URI_ENV, url)
        yield url


@pytest.fixture(scope="module")
def two_runs(mlflow_server, tf_runtime) -> dict[str, dict[str, str]]:
    """strategy → {run_id, run_name, experiment_id} of two 2-epoch digits runs, evaluated."""
    from stratoflow.tasks import evaluate, prepare, train
    from stratoflow.tasks.run_context import AirflowRun
    from stratoflow.tracking import mlflow_runs

    runs = {}
    for strategy in STRATEGIES:
        run = AirflowRun("retrain_digits", f"manual__{strategy}_{uuid.uuid4().hex[:8]}")
        params = {"strategy": strategy, "epochs": 2}
        prepared = prepare.prepare("digits", params, run)
        trained = train.train(run, prepared)
        evaluate.evaluate(run, prepared, trained)
        mlflow_runs.finish_run(trained.mlflow_run_id)
        mlflow_run = mlflow_runs.client().get_run(trained.mlflow_run_id)
        runs[strategy] = {
            "run_id": mlflow_run.info.run_id,
            "run_name": mlflow_run.info.run_name,
            "experiment_id": mlflow_run.info.experiment_id,
        }
    return runs


def test_environment_json_names_each_runs_strategy_and_replicas(two_runs, tmp_path):
    from stratoflow.tracking import mlflow_runs

    mlflow_client = mlflow_runs.client()
    for strategy, replicas in zip(STRATEGIES, (1, 2), strict=True):
        path = mlflow_client.download_artifacts(
            two_runs[strategy]["run_id"], names.ENVIRONMENT_ARTIFACT, str(tmp_path / strategy)
        )
        environment = json.loads(Path(path).read_text())
        assert (environment["strategy"], environment["num_replicas"]) == (strategy, replicas)
        assert len(environment["devices"]["logical"]) == replicas  # CPU split for mirrored


def test_compare_plots_a_line_per_run_and_prints_the_ui_compare_link(
    two_runs, mlflow_server, tmp_path, capsys
):
    ids = [two_runs[strategy]["run_id"] for strategy in STRATEGIES]
    plot = tmp_path / "compare.png"
    assert (
        main.main(["compare", "digits", "--run", ids[0], "--run", ids[1], "--plot", str(plot)]) == 0
    )

    printed = capsys.readouterr().out
    assert "one_device" in printed and "mirrored" in printed
    link = next(line for line in printed.splitlines() if "compare them in the MLflow UI" in line)
    url = link.split(": ", 1)[1]
    assert url.startswith(f"{mlflow_server}/#/compare-runs?runs=")
    assert all(run_id in url for run_id in ids)
    assert png_size(plot.read_bytes())[0] >= 600
    assert colour_pixels(plot, "C0") > 100 and colour_pixels(plot, "C1") > 100
    assert colour_pixels(plot, "C2") == 0  # two runs, two lines


def test_the_mlflow_ui_compares_both_runs_their_strategies_and_figures(
    two_runs, mlflow_server, capsys, tmp_path
):
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"Chromium is not installed at {CHROMIUM}: `apt-get install -y chromium` "
            "(.ci/run does it) to run this test"
        )
    from playwright.sync_api import sync_playwright

    from stratoflow.tracking import mlflow_runs, reports

    runs = [two_runs[strategy] for strategy in STRATEGIES]
    url = reports.compare_url([r["run_id"] for r in runs], [r["experiment_id"] for r in runs])
    figures = (names.CURVES_ARTIFACT, names.CONFUSION_MATRIX_ARTIFACT)
    widths = {
        name: png_size(
            Path(
                mlflow_runs.client().download_artifacts(runs[0]["run_id"], name, str(tmp_path))
            ).read_bytes()
        )[0]
        for name in figures
    }
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    screenshots = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1200})
            page.set_default_timeout(PAGE_RENDER_MS)
            page.goto(url)
            for run in runs:
                page.get_by_text(run["run_name"], exact=True).first.wait_for()
            row = page.locator("tr", has_text="training.strategy").first
            row.wait_for()
            cells = [cell.strip() for cell in row.locator("td").all_inner_texts()]
            # The parameters table: the key, then one value per run, in the link's order.
            assert cells[-2:] == list(STRATEGIES), cells
            page.get_by_role("switch").first.click()  # Parameters: show diff only
            close_assistant = page.get_by_role("button", name="Close")
            if close_assistant.count():
                close_assistant.first.click()
            screenshots.append(_screenshot(page, "Run details", "mlflow-ui-compare.png"))

            # Each figure, previewed side by side: one image per run, at the PNG's own size.
            for name in figures:
                # A dispatched click: the first preview overlaps the file list in this layout.
                page.get_by_text(name, exact=True).first.dispatch_event("click")
                page.wait_for_function(
                    """width => new Set([...document.querySelectorAll("img[src^='blob:']")]
                        .filter(image => image.complete && image.naturalWidth === width)
                        .map(image => image.src)).size === 2""",
                    arg=widths[name],
                )
                shot = f"mlflow-ui-compare-{name.removesuffix('.png').replace('_', '-')}.png"
                screenshots.append(_screenshot(page, "Artifacts", shot))
        finally:
            browser.close()
    with capsys.disabled():  # shown even when output is captured
        for path in screenshots:
            sys.stdout.write(f"\nscreenshot of the MLflow UI compare page: {path}")
        sys.stdout.write("\n")
    assert all(png_size(path.read_bytes())[0] == 1600 for path in screenshots)


def _screenshot(page, heading: str, name: str) -> Path:
    """Scroll the section `heading` to the top of the page and save a screenshot."""
    page.get_by_text(heading, exact=True).first.evaluate(
        "element => element.scrollIntoView({block: 'start'})"
    )
    page.wait_for_timeout(500)  # let the scroll and images settle
    path = ARTIFACTS_DIR / name
    page.screenshot(path=str(path))
    return path
