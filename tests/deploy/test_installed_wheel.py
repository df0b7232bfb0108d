"""stratoflow installed from its wheel into a team's own Airflow, the way a team adds it.

The wheel is built from this checkout and installed into a fresh virtualenv beside a plain
Airflow 3.3, with no checkout on the path and the current directory elsewhere. The team's DAGs
folder already holds its own `tasks.py`, a `pipelines/` package and a `dags_helpers` module, used
by a DAG of its own, plus the two small files that publish stratoflow's DAGs for a pipelines folder
outside it (docs/how-to/your-airflow.md). The MLflow server is named only by the Airflow
Connection `stratoflow_mlflow`, added with `airflow connections add`. There, `airflow dags test`
of a retrain DAG succeeds and logs to that server, and the team's modules still import as theirs.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import mlflow
import pytest

from stratoflow.config import connections, locations, names
from tests.support.mlflow_server import mlflow_server

pytestmark = pytest.mark.integration

ROOT = locations.PROJECT_ROOT
UV = Path(sys.executable).with_name("uv")
AIRFLOW_REQUIREMENT = "apache-airflow==3.3.*"
PIPELINE = "team_digits"
TEAM_MODEL = "team-digits"

TEAM_FILES = {
    # Generic names a team's DAGs folder commonly has; Airflow puts the folder on sys.path.
    "tasks.py": 'OWNER = "team"\n',
    "pipelines/__init__.py": 'OWNER = "team"\n',
    "dags_helpers.py": 'OWNER = "team"\n',
    "team_report.py": textwrap.dedent(
        '''
        """The team's own Airflow DAG: it refuses to parse unless its modules are its own."""
        from airflow.sdk import DAG
        from airflow.providers.standard.operators.empty import EmptyOperator

        import dags_helpers
        import pipelines
        import tasks

        owners = {module.__name__: module.OWNER for module in (tasks, pipelines, dags_helpers)}
        assert set(owners.values()) == {"team"}, owners

        with DAG("team_report", schedule=None) as dag:
            EmptyOperator(task_id="report")
        '''
    ),
}

PUBLISH_FILE = """\
# stratoflow's Airflow DAGs for the team's pipelines.
from stratoflow.dags import publish

publish(globals(), pipelines={folder!r})
"""
ERRORS_FILE = """\
# Why a pipeline has no Airflow DAG (this file defines no DAG).
from stratoflow.dags import raise_pipeline_errors

raise_pipeline_errors(pipelines={folder!r})
"""


PARSE_SCRIPT = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.providers_manager import ProvidersManager

sys.path.insert(0, sys.argv[1])  # as Airflow's own processes put the DAGs folder on the path
bag = DagBag(dag_folder=sys.argv[1])
print(json.dumps({"dag_ids": sorted(bag.dag_ids), "import_errors": bag.import_errors,
                  "connection_types": sorted(ProvidersManager().hooks)}))
"""


def copy_of_the_checkout(target: Path) -> Path:
    """The tracked files of this checkout, links kept as links (what a clone holds)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, (entry.decode() for entry in listed)):
        source, copy = ROOT / name, target / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree, not yet committed
        copy.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            copy.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, copy)
    return target


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)
    assert result.returncode == 0, f"{command}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = copy_of_the_checkout(tmp_path_factory.mktemp("checkout"))
    out = tmp_path_factory.mktemp("wheel")
    run([str(UV), "build", "--wheel", "--out-dir", str(out)], cwd=source, timeout=600)
    (built,) = out.glob("stratoflow-*.whl")
    return built


def test_the_wheel_installs_one_import_name(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        top_level = {name.split("/")[0] for name in archive.namelist()}
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"stratoflow"}
    assert {name for name in top_level if name.endswith(".dist-info")} == {
        wheel.name.split("-py3")[0] + ".dist-info"
    }


@pytest.fixture(scope="module")
def team_airflow(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A fresh virtualenv holding the wheel and a plain Airflow, and a team's DAGs folder."""
    place = tmp_path_factory.mktemp("team")
    venv = place / "venv"
    run([str(UV), "venv", "--python", sys.executable, str(venv)], timeout=300)
    run(
        [
            str(UV),
            "pip",
            "install",
            "--python",
            str(venv / "bin" / "python"),
            str(wheel),
            AIRFLOW_REQUIREMENT,
        ],
        timeout=900,
    )
    dags = place / "dags"
    for name, text in TEAM_FILES.items():
        (dags / name).parent.mkdir(parents=True, exist_ok=True)
        (dags / name).write_text(text)
    # The team's pipelines live outside the DAGs folder: a copy of the bundled digits pipeline.
    team_pipelines = place / "ml_pipelines"
    shutil.copytree(ROOT / "pipelines" / "digits", team_pipelines / PIPELINE)
    # A short run must clear the gate to be promoted: bounds a 2-epoch MLP always reaches.
    spec = team_pipelines / PIPELINE / "pipeline.yaml"
    text = spec.read_text()
    for bound, loose in (("min: 0.9,", "min: 0.5,"), ("max: 0.4,", "max: 2.0,")):
        assert bound in text, f"the digits gate changed: {bound!r} is gone"
        text = text.replace(bound, loose)
    spec.write_text(
        text.replace("registered_model: stratoflow-digits", f"registered_model: {TEAM_MODEL}")
    )
    (dags / "stratoflow_dags.py").write_text(PUBLISH_FILE.format(folder=str(team_pipelines)))
    (dags / "stratoflow_pipeline_errors.py").write_text(
        ERRORS_FILE.format(folder=str(team_pipelines))
    )
    env = {
        # Nothing of this checkout or its virtualenv: the PATH of the new one, the system's tools.
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(place),
        "AIRFLOW_HOME": str(place / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "STRATOFLOW_HOME": str(place / "stratoflow"),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
    }
    (place / "elsewhere").mkdir()  # the current directory of every command: nothing on it
    run(["airflow", "db", "migrate"], env=env, cwd=place / "elsewhere", timeout=600)
    return env


def test_a_retrain_dag_runs_in_the_teams_airflow_and_logs_where_its_connection_says(
    team_airflow: dict[str, str], tmp_path: Path
) -> None:
    env, cwd = team_airflow, Path(team_airflow["HOME"]) / "elsewhere"
    # Neither the checkout's names nor the team's leak: plain Python there has no `tasks` at all.
    probe = run(
        [
            "python",
            "-c",
            "import importlib.util as u, stratoflow; "
            "print(stratoflow.__file__, u.find_spec('tasks'), u.find_spec('dags'))",
        ],
        env=env,
        cwd=cwd,
    )
    assert "site-packages/stratoflow" in probe.stdout and probe.stdout.split()[1:] == ["None"] * 2
    # What the DAG processor finds there, and the connection types of Airflow's form (from the
    # installed entry point), in one process.
    parsed = json.loads(
        run(["python", "-c", PARSE_SCRIPT, env["AIRFLOW__CORE__DAGS_FOLDER"]], env=env, cwd=cwd)
        .stdout.strip()
        .splitlines()[-1]
    )
    assert parsed["import_errors"] == {}, parsed["import_errors"]
    assert {"team_report", names.retrain_dag_id(PIPELINE), "refresh_stratoflow_digits"} <= set(
        parsed["dag_ids"]
    )
    assert names.retrain_dag_id("digits") not in parsed["dag_ids"]  # examples only when asked
    assert connections.MLFLOW_CONNECTION_TYPE in parsed["connection_types"]

    with mlflow_server(tmp_path) as url:
        run(
            [
                "airflow",
                "connections",
                "add",
                connections.MLFLOW_CONNECTION_ID,
                "--conn-type",
                connections.MLFLOW_CONNECTION_TYPE,
                "--conn-host",
                url,
            ],
            env=env,
            cwd=cwd,
        )
        dag_test = subprocess.run(
            [
                "airflow",
                "dags",
                "test",
                names.retrain_dag_id(PIPELINE),
                "-c",
                json.dumps({"epochs": 2}),
            ],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        output = dag_test.stdout + dag_test.stderr
        with sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db") as metadata:
            states = metadata.execute(
                "SELECT task_id, state FROM task_instance WHERE dag_id = ?",
                (names.retrain_dag_id(PIPELINE),),
            ).fetchall()
        assert dag_test.returncode == 0, output[-4000:]
        assert {state for _, state in states} == {"success"} and len(states) == 5, states
        assert f"from the Airflow connection '{connections.MLFLOW_CONNECTION_ID}': {url}" in output

        # The registry too: the worker's own MLFLOW_TRACKING_URI (another test's store) would
        # otherwise be the registry this client asks.
        client = mlflow.MlflowClient(tracking_uri=url, registry_uri=url)
        experiment = client.get_experiment_by_name(names.experiment_name(PIPELINE))
        assert experiment is not None, "nothing was logged to the connection's server"
        (finished,) = client.search_runs([experiment.experiment_id])
        assert finished.info.status == "FINISHED"
        assert finished.data.metrics["test_accuracy"] > 0.5
        champion = client.get_model_version_by_alias(TEAM_MODEL, names.CHAMPION)
        assert champion.run_id == finished.info.run_id
    # Nothing fell back to a local store.
    assert not (Path(env["STRATOFLOW_HOME"]) / "mlflow.db").exists()
