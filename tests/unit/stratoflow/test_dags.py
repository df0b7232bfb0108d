"""DagBag integrity: `dags/` parses without errors, cheaply, into one well-formed DAG per spec.

Parsing happens in a fresh subprocess, as Airflow's DAG processor does it: the pytest process may
have imported TensorFlow already, which would hide a DAG file that imports it at parse time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from stratoflow.config import assets, locations, names
from stratoflow.config.options import LOOPS, PS_CHOICES, REPLICA_CHOICES, WORKER_CHOICES
from stratoflow.config.params import dag_params
from stratoflow.config.spec import list_pipelines, load_spec
from stratoflow.config.strategies import STRATEGIES
from stratoflow.services import airflow_setup

TASK_IDS = [
    "prepare_dataset",
    "validate_data",
    "train_model",
    "evaluate_model",
    "log_and_register",
]
HEAVY_MODULES = ["tensorflow", "mlflow", "tensorflow_datasets", "keras"]
PARSE_TIME_BOUND_S = 60

_PARSE_SCRIPT = textwrap.dedent(
    """
    import json, sys, time

    started = time.perf_counter()
    from airflow.dag_processing.dagbag import DagBag

    imported = time.perf_counter()
    bag = DagBag(dag_folder=sys.argv[1])
    parsed = time.perf_counter()

    def cron_of(dag):
        return getattr(dag.timetable, "timetable", None)

    def describe(dag):
        tasks = dag.topological_sort()
        return {
            "task_order": [t.task_id for t in tasks],
            "upstream": {t.task_id: sorted(t.upstream_task_ids) for t in tasks},
            "tasks": {
                t.task_id: {
                    "owner": t.owner,
                    "retries": t.retries,
                    "retry_delay_s": t.retry_delay.total_seconds(),
                    "failure_callbacks": len(t.on_failure_callback or []),
                    "multiple_outputs": t.multiple_outputs,
                    "is_mapped": bool(getattr(t, "is_mapped", False)),
                    "trigger_rule": str(t.trigger_rule.value),
                    "max_active_tis_per_dag": t.max_active_tis_per_dag,
                    "map_index_template": t.map_index_template,
                }
                for t in tasks
            },
            "params": {
                key: {"value": p.value, "schema": p.schema, "description": p.description}
                for key, p in dag.params.items()
            },
            "timetable": type(dag.timetable).__name__,
            "cron": getattr(cron_of(dag), "expression", None),
            "cron_timezone": str(getattr(cron_of(dag), "timezone", "")),
            "asset_uris": [
                asset.uri
                for asset in getattr(getattr(dag.timetable, "asset_condition", None), "objects", [])
            ],
            "outlets": {t.task_id: sorted(a.uri for a in t.outlets) for t in tasks},
            "catchup": dag.catchup,
            "max_active_runs": dag.max_active_runs,
            "tags": sorted(dag.tags),
            "owner": dag.default_args.get("owner"),
            "description": dag.description,
            "doc_md": dag.doc_md,
            "start_date": dag.start_date.isoformat() if dag.start_date else None,
        }

    print(json.dumps({
        "import_errors": bag.import_errors,
        "dags": {dag_id: describe(dag) for dag_id, dag in bag.dags.items()},
        "heavy_modules": [m for m in sys.argv[2].split(",") if m in sys.modules],
        "airflow_import_s": imported - started,
        "parse_s": parsed - imported,
    }))
    """
)


def _parse(session_home: Path, heavy: list[str], **env: str) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="airflow-dagbag-", dir=session_home))
    result = subprocess.run(
        [sys.executable, "-c", _PARSE_SCRIPT, str(locations.DAGS_FOLDER), ",".join(heavy)],
        env={**airflow_setup.airflow_env(home), **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def parsed(session_home: Path) -> dict[str, Any]:
    """What a fresh Airflow process sees when it parses `dags/`."""
    return _parse(session_home, HEAVY_MODULES)


USER_MODEL = """
import tensorflow  # parsing must never import this module, so never TensorFlow through it

def build(features, target, width=8):
    raise AssertionError("not called at parse time")
"""


def _user_pipeline(folder: Path, builder: str) -> Path:
    """A pipeline folder of its own: the mnist spec with `model.builder` replaced."""
    folder.mkdir(parents=True)
    spec = (locations.PROJECT_ROOT / "pipelines" / "mnist" / "pipeline.yaml").read_text()
    spec = spec.replace("builder: small_cnn", f"builder: {builder!r}")
    spec = spec.replace("filters: [32, 64], dense_units: 128, dropout: 0.0", "width: 4")
    (folder / "pipeline.yaml").write_text(spec.replace("stratoflow-mnist", f"my-{folder.name}"))
    (folder / "model.py").write_text(USER_MODEL)
    return folder


@pytest.fixture(scope="module")
def parsed_with_user_pipelines(session_home: Path, tmp_path_factory) -> dict[str, Any]:
    """`dags/` parsed with two entries on STRATOFLOW_PIPELINES_PATH: a folder of pipelines (one
    good, one broken) and a single pipeline folder whose name clashes with a bundled one."""
    team = tmp_path_factory.mktemp("team-pipelines")
    _user_pipeline(team / "mine", "model:build")
    broken = _user_pipeline(team / "broken", "model build")  # not an import path
    clash = _user_pipeline(tmp_path_factory.mktemp("other") / "digits", "model:build")
    parsed = _parse(
        session_home,
        [*HEAVY_MODULES, "stratoflow_pipeline_mine", "stratoflow_pipeline_broken"],
        STRATOFLOW_PIPELINES_PATH=f"{team}:{clash}",
        # The deployment's named clusters: the cluster Params offer their names, nothing else.
        STRATOFLOW_RAY_CLUSTERS='{"east": "10.0.0.1:6379", "west": "ray://10.0.1.1:10001"}',
        STRATOFLOW_CLUSTER='{"worker": ["w0:2222"], "ps": ["ps0:2222"]}',
    )
    parsed["files"] = {"broken": str(broken / "pipeline.yaml"), "clash": str(clash)}
    return parsed


def test_a_pipeline_on_the_path_gets_its_dags_without_its_code_imported(
    parsed_with_user_pipelines: dict[str, Any],
) -> None:
    parsed = parsed_with_user_pipelines
    assert {"retrain_mine", "benchmark_strategies_mine", "retrain_mnist"} <= set(parsed["dags"])
    assert parsed["dags"]["retrain_mine"]["task_order"] == TASK_IDS
    # Neither its module (which imports TensorFlow) nor anything heavy was imported.
    assert parsed["heavy_modules"] == []


def test_the_cluster_params_offer_only_the_deployments_cluster_names(
    parsed_with_user_pipelines: dict[str, Any],
) -> None:
    for dag_id in ("retrain_mine", "retrain_mnist"):
        params = parsed_with_user_pipelines["dags"][dag_id]["params"]
        assert params["ray_cluster"]["schema"]["enum"] == [None, "", "east", "west"]
        assert params["cluster"]["schema"]["enum"] == [None, "", "default"]
        assert params["ray_cluster"]["value"] is None  # the form's default: cluster 'default'
        # The form shows names only: no address reaches the trigger form.
        assert "10.0." not in json.dumps(params)


def test_a_broken_pipeline_is_an_import_error_naming_its_file_and_field_and_the_rest_parse(
    parsed_with_user_pipelines: dict[str, Any],
) -> None:
    parsed = parsed_with_user_pipelines
    # The failures are the import error of a file with no DAG of its own: the DAG files that
    # publish the other pipelines have none (Airflow would mark all their DAGs stale).
    errors = parsed["import_errors"]
    assert [Path(path).name for path in errors] == ["pipeline_errors.py"], list(errors)
    pipeline_errors = next(iter(errors.values()))
    assert (
        f"pipeline 'broken': {parsed['files']['broken']}: model.builder 'model build' is not a "
        "known model builder; allowed: mlp, small_cnn, or an import path 'module:function'"
    ) in pipeline_errors
    # Two folders named digits: neither wins, the error names both.
    assert "pipeline name 'digits' is claimed by 2 folders" in pipeline_errors
    assert parsed["files"]["clash"] in pipeline_errors
    assert "retrain_broken" not in parsed["dags"] and "retrain_digits" not in parsed["dags"]
    # Every other pipeline still has its DAGs.
    assert {"retrain_mnist", "retrain_penguins", "retrain_diabetes", "retrain_mine"} <= set(
        parsed["dags"]
    )
    # Listed once, though both the retrain and the benchmark DAG files failed to load it.
    assert pipeline_errors.count("pipeline 'broken':") == 1


def test_no_import_errors(parsed: dict[str, Any]) -> None:
    assert parsed["import_errors"] == {}


def test_one_retrain_dag_per_pipeline_and_one_refresh_dag_per_dataset(
    parsed: dict[str, Any],
) -> None:
    assert set(list_pipelines()) == {"mnist", "digits", "penguins", "diabetes"}
    assert sorted(parsed["dags"]) == [
        "benchmark_strategies_digits",
        "benchmark_strategies_mnist",
        "benchmark_strategies_penguins",  # none for diabetes: regression
        "refresh_stratoflow_diabetes",
        "refresh_stratoflow_digits",
        "refresh_stratoflow_mnist5k",
        "refresh_stratoflow_penguins",
        "retrain_diabetes",
        "retrain_digits",
        "retrain_mnist",
        "retrain_penguins",
    ]
    # The runner and the assets module find the DAGs by the same naming rules.
    retrain = sorted(d for d in parsed["dags"] if d.startswith("retrain_"))
    benchmark = sorted(d for d in parsed["dags"] if d.startswith("benchmark_strategies_"))
    assert sorted(names.retrain_dag_id(name) for name in list_pipelines()) == retrain
    classifiers = [name for name in list_pipelines() if load_spec(name).task == "classification"]
    assert sorted(names.benchmark_dag_id(name) for name in classifiers) == benchmark
    assert sorted(names.refresh_dag_id(name) for name in assets.datasets_in_use()) == sorted(
        set(parsed["dags"]) - set(retrain) - set(benchmark)
    )
    # `stratoflow list` shows each pipeline's DAG ids without Airflow: the same ones.
    from stratoflow.cli.check import dag_ids

    listed = {dag_id for name in list_pipelines() for dag_id in dag_ids(load_spec(name))}
    assert listed == set(parsed["dags"])


@pytest.mark.parametrize(
    "dag_id, built",
    [
        ("retrain_digits", ["retrain_digits"]),
        ("benchmark_strategies_mnist", ["benchmark_strategies_mnist"]),
        # A refresh DAG names the pipelines reading its dataset: every spec is read for it.
        ("refresh_stratoflow_digits", "all"),
    ],
)
def test_a_parse_for_one_dag_builds_only_that_dag_the_same_as_a_full_parse(
    session_home: Path, parsed: dict[str, Any], dag_id: str, built: list[str] | str
) -> None:
    # A task's process parses its DAG file with Airflow's parsing context naming its DAG, and so
    # does `airflow dags test` (Airflow's context manager leaves it set for the whole command).
    one = _parse(session_home, HEAVY_MODULES, _AIRFLOW_PARSING_CONTEXT_DAG_ID=dag_id)
    assert one["import_errors"] == {}
    assert sorted(one["dags"]) == (sorted(parsed["dags"]) if built == "all" else built)
    assert one["dags"][dag_id] == parsed["dags"][dag_id]


def test_a_parse_for_one_dag_still_reports_every_pipeline_that_does_not_load(
    session_home: Path, tmp_path: Path
) -> None:
    # The import error a parse records replaces the last one: narrowing it to the one DAG's
    # pipeline would clear a broken pipeline's error from the UI.
    broken = _user_pipeline(tmp_path / "broken", "model build")  # not an import path
    one = _parse(
        session_home,
        HEAVY_MODULES,
        _AIRFLOW_PARSING_CONTEXT_DAG_ID="retrain_mnist",
        STRATOFLOW_PIPELINES_PATH=str(tmp_path),
    )
    assert sorted(one["dags"]) == ["retrain_mnist"]
    (error,) = one["import_errors"].values()
    assert f"pipeline 'broken': {broken / 'pipeline.yaml'}: model.builder" in error


def test_parsing_imports_nothing_heavy_and_is_quick(parsed: dict[str, Any]) -> None:
    assert parsed["heavy_modules"] == []
    assert parsed["parse_s"] < PARSE_TIME_BOUND_S


@pytest.mark.parametrize("pipeline", ["mnist", "digits"])
def test_tasks_run_in_order(parsed: dict[str, Any], pipeline: str) -> None:
    dag = parsed["dags"][f"retrain_{pipeline}"]
    assert dag["task_order"] == TASK_IDS
    assert dag["upstream"] == {
        "prepare_dataset": [],
        "validate_data": ["prepare_dataset"],
        "train_model": ["prepare_dataset", "validate_data"],
        "evaluate_model": ["prepare_dataset", "train_model"],
        "log_and_register": ["evaluate_model", "prepare_dataset", "train_model"],
    }
    # Each result travels as one small dict, not one XCom per key.
    assert {task["multiple_outputs"] for task in dag["tasks"].values()} == {False}


@pytest.mark.parametrize("pipeline", ["mnist", "digits"])
def test_schedule_and_run_settings_come_from_the_spec(
    parsed: dict[str, Any], pipeline: str
) -> None:
    spec = load_spec(pipeline)
    dag = parsed["dags"][f"retrain_{pipeline}"]
    # The spec's cron or an event of the dataset's asset, whichever comes first.
    assert dag["timetable"] == "AssetOrTimeSchedule"
    assert dag["cron"] == spec.schedule
    assert dag["cron_timezone"] == "UTC"
    assert dag["asset_uris"] == [names.asset_uri(spec.dataset.name)]
    assert dag["catchup"] is False
    assert dag["max_active_runs"] == 1
    assert dag["start_date"] is not None
    assert dag["owner"] == spec.owner
    assert dag["tags"] == sorted({*spec.tags, "stratoflow"})
    assert dag["description"] == spec.description


@pytest.mark.parametrize("pipeline", ["mnist", "digits"])
def test_every_task_retries_and_cleans_up_after_a_final_failure(
    parsed: dict[str, Any], pipeline: str
) -> None:
    spec = load_spec(pipeline)
    for task_id, task in parsed["dags"][f"retrain_{pipeline}"]["tasks"].items():
        assert task["owner"] == spec.owner, task_id
        assert task["retries"] == spec.retries, task_id
        assert task["retry_delay_s"] == spec.retry_delay_seconds, task_id
        # The clean-up first, then the mail (`stratoflow/dags/notifications.py`).
        assert task["failure_callbacks"] == 2, task_id


@pytest.mark.parametrize("pipeline", ["mnist", "digits"])
def test_params_offer_every_training_setting_with_choices(
    parsed: dict[str, Any], pipeline: str
) -> None:
    spec = load_spec(pipeline)
    params = parsed["dags"][f"retrain_{pipeline}"]["params"]
    assert list(params) == [
        "strategy",
        "replicas",
        "workers",
        "ps",
        "cluster",
        "launcher",
        "ray_cluster",
        "placement",
        "max_restarts",
        "warm_spares",
        "loop",
        "epochs",
        "batch_size",
        "learning_rate",
        "seed",
        "cache_budget_mb",
        "promote",
        "accept_drift",
        "force",
    ]
    for key, param in params.items():
        default = getattr(spec.training, key)
        # No standing cluster is null in the form (an empty required string would block it).
        optional = key in ("cluster", "ray_cluster")
        assert param["value"] == (default or None if optional else default), key
        assert param["description"], key
        kinds = ("string", "integer", "number", "boolean", ["null", "string"])
        assert param["schema"]["type"] in kinds, key
    assert params["strategy"]["schema"]["enum"] == list(STRATEGIES)
    assert params["loop"]["schema"]["enum"] == list(LOOPS)
    # No cluster configured where this parse ran: a run may only leave them empty.
    assert (
        params["cluster"]["schema"]["enum"]
        == params["ray_cluster"]["schema"]["enum"]
        == [
            None,
            "",
        ]
    )
    assert params["replicas"]["schema"]["enum"] == list(REPLICA_CHOICES)
    assert params["workers"]["schema"]["enum"] == list(WORKER_CHOICES)
    assert params["ps"]["schema"]["enum"] == list(PS_CHOICES)
    assert params["epochs"]["schema"]["minimum"] == 1
    assert params["cache_budget_mb"]["schema"]["minimum"] == 0
    assert params["promote"]["schema"]["type"] == "boolean"
    assert params["force"]["schema"]["type"] == "boolean" and params["force"]["value"] is False
    # What the DAG carries is exactly what `stratoflow.config.params` declares.
    expected = dag_params(spec)
    for key, param in params.items():
        declared = {k: v for k, v in expected[key].items() if k not in ("default", "description")}
        assert param["schema"] == json.loads(json.dumps(declared)), key


@pytest.mark.parametrize("pipeline", ["mnist", "digits"])
def test_doc_md_explains_the_dag_and_the_pipeline(parsed: dict[str, Any], pipeline: str) -> None:
    spec = load_spec(pipeline)
    doc = parsed["dags"][f"retrain_{pipeline}"]["doc_md"]
    assert doc.startswith("Retrain a TensorFlow model and track it in MLflow")
    assert spec.description in doc
    assert spec.registered_model in doc


def _ui_form_errors(params: dict[str, Any]) -> list[str]:
    """The Params whose default makes Airflow 3.3's trigger form invalid (Trigger disabled).

    The UI's rule (its FlexibleForm, in the JavaScript Airflow ships): a Param is required when
    its schema has a `type` that is not a list containing "null"; the form is invalid while a
    required Param's value is null, missing or "". The REST API then validates the submitted
    values against the schema, so a default must also pass its own schema.
    """
    from jsonschema import ValidationError, validate

    errors = []
    for key, param in params.items():
        schema, value = param["schema"], param["value"]
        kind = schema.get("type")
        required = bool(kind) and not (isinstance(kind, list) and "null" in kind)
        if required and value in (None, ""):
            errors.append(f"{key}: required ({kind}) with the empty default {value!r}")
        try:
            validate(value, schema)
        except ValidationError as error:
            errors.append(f"{key}: default {value!r} fails its schema: {error.message}")
    return errors


def test_every_params_default_makes_a_valid_trigger_form(parsed: dict[str, Any]) -> None:
    dag_ids = [
        dag_id
        for dag_id in parsed["dags"]
        if dag_id.startswith(("retrain_", "benchmark_strategies_"))
    ]
    # A benchmark DAG per classification pipeline (all but diabetes).
    assert len(dag_ids) == 2 * len(list_pipelines()) - 1
    errors = {
        dag_id: found
        for dag_id in dag_ids
        if (found := _ui_form_errors(parsed["dags"][dag_id]["params"]))
    }
    assert errors == {}


def test_the_form_rule_flags_a_required_empty_default() -> None:
    # The rule above must be able to fail: the `cluster` Param as it once was.
    assert _ui_form_errors({"cluster": {"schema": {"type": "string"}, "value": ""}})
    assert _ui_form_errors({"epochs": {"schema": {"type": "integer"}, "value": None}})
    assert not _ui_form_errors({"cluster": {"schema": {"type": ["null", "string"]}, "value": None}})
    assert not _ui_form_errors({"strategies": {"schema": {"type": "array"}, "value": []}})


# --- the strategy benchmark DAGs (stratoflow/dags/benchmark_strategies.py)
# ------------------------------


@pytest.mark.parametrize("pipeline", ["mnist", "digits"])
def test_benchmark_maps_one_training_per_strategy_then_compares_whatever_finished(
    parsed: dict[str, Any], pipeline: str
) -> None:
    spec = load_spec(pipeline)
    dag = parsed["dags"][f"benchmark_strategies_{pipeline}"]
    assert dag["task_order"] == ["plan_strategies", "train_strategy", "compare_strategies"]
    assert dag["upstream"] == {
        "plan_strategies": [],
        "train_strategy": ["plan_strategies"],
        "compare_strategies": ["plan_strategies", "train_strategy"],
    }
    tasks = dag["tasks"]
    assert [name for name, t in tasks.items() if t["is_mapped"]] == ["train_strategy"]
    training = tasks["train_strategy"]
    # A failed strategy is a result: no retry (it would resume and time another run), one
    # training at a time (they would share the cores), each instance named by its strategy.
    assert training["retries"] == 0
    assert training["max_active_tis_per_dag"] == 1
    assert "strategy" in training["map_index_template"]
    assert training["failure_callbacks"] == 0  # a failed strategy must not fail the parent
    assert tasks["compare_strategies"]["trigger_rule"] == "all_done"
    assert tasks["plan_strategies"]["trigger_rule"] == "all_success"
    for name in ("plan_strategies", "compare_strategies"):
        assert tasks[name]["retries"] == spec.retries
        assert tasks[name]["failure_callbacks"] == 1
    assert dag["timetable"] == "NullTimetable"  # manual trigger only
    assert dag["max_active_runs"] == 1
    assert "benchmark" in dag["tags"]
    assert dag["doc_md"].startswith("Benchmark the `tf.distribute` strategies on this host")


@pytest.mark.parametrize("pipeline", ["mnist", "digits"])
def test_benchmark_params_are_validated_choices(parsed: dict[str, Any], pipeline: str) -> None:
    from stratoflow.config.params import benchmark_params

    params = parsed["dags"][f"benchmark_strategies_{pipeline}"]["params"]
    assert list(params) == ["epochs", "seed", "strategies", "tolerance"]
    assert params["strategies"]["value"] == []
    assert params["strategies"]["schema"]["type"] == "array"
    assert params["strategies"]["schema"]["items"]["enum"] == list(STRATEGIES)
    assert params["epochs"]["value"] == 3
    assert params["tolerance"]["schema"]["maximum"] == 1
    expected = benchmark_params(load_spec(pipeline))
    for key, param in params.items():
        declared = {k: v for k, v in expected[key].items() if k not in ("default", "description")}
        assert param["schema"] == json.loads(json.dumps(declared)), key


@pytest.mark.parametrize("dataset", ["stratoflow_mnist5k", "stratoflow_digits"])
def test_refresh_dag_emits_the_asset_its_readers_are_scheduled_on(
    parsed: dict[str, Any], dataset: str
) -> None:
    dag = parsed["dags"][names.refresh_dag_id(dataset)]
    assert dag["timetable"] == "NullTimetable"  # triggered by whoever has new data
    assert dag["task_order"] == ["refresh"]
    assert dag["outlets"] == {"refresh": [f"x-tfds://{dataset}"]}
    assert dag["catchup"] is False and dag["max_active_runs"] == 1
    readers = [
        dag_id
        for dag_id, other in parsed["dags"].items()
        if names.asset_uri(dataset) in other["asset_uris"]
    ]
    assert readers == [names.retrain_dag_id(p) for p in assets.pipelines_reading(dataset)]
    assert readers  # each shipped dataset feeds a pipeline
