"""Every name stratoflow shows to the outside world, in one place.

DAG and task ids (the Airflow UI and REST API), asset names, MLflow experiment names, run tags,
model aliases, metric and artifact names: users, dashboards and scripts depend on them, so each
is written once here and every other module reads it from here. A name changed here is a
change users see: docs/reference/mlflow-names.md lists them.
"""

from __future__ import annotations

# Airflow: DAG ids are a prefix and the pipeline (or dataset) name.
RETRAIN_DAG_PREFIX = "retrain_"
BENCHMARK_DAG_PREFIX = "benchmark_strategies_"
REFRESH_DAG_PREFIX = "refresh_"

# The task ids of a retrain DAG, in order.
PREPARE_TASK = "prepare_dataset"
VALIDATE_DATA_TASK = "validate_data"
TRAIN_TASK = "train_model"
EVALUATE_TASK = "evaluate_model"
REGISTER_TASK = "log_and_register"
# Only in a pipeline whose promotion needs approval (`promotion.approval: required`).
APPROVE_TASK = "approve_promotion"
PROMOTE_TASK = "promote_champion"
# The task ids of a strategy benchmark DAG, in order, and the one task of a refresh DAG.
PLAN_STRATEGIES_TASK = "plan_strategies"
TRAIN_STRATEGY_TASK = "train_strategy"
COMPARE_STRATEGIES_TASK = "compare_strategies"
REFRESH_TASK = "refresh"

# Airflow assets: one per TFDS dataset, `x-tfds://<dataset>` (Airflow's `x-` marks our scheme).
ASSET_GROUP = "tfds"
ASSET_URI_SCHEME = "x-tfds"

# MLflow model aliases.
CHAMPION = "champion"
CHALLENGER = "challenger"

# MLflow run tags: which Airflow run a run belongs to, and what stratoflow recorded about it.
DAG_ID_TAG = "airflow.dag_id"
RUN_ID_TAG = "airflow.run_id"
TRY_NUMBER_TAG = "airflow.try_number"
RUN_NAME_TAG = "mlflow.runName"
# Who made a run: MLflow's user tag (the run's `user_id`: the MLflow account it logs as, or the
# OS user for a local store), and the Airflow user who triggered its DAG run; a run no user
# triggered holds its run type in parentheses instead, e.g. `(scheduled)`, `(asset_triggered)`.
USER_TAG = "mlflow.user"
TRIGGERED_BY_TAG = "airflow.triggered_by"
PARENT_RUN_TAG = "mlflow.parentRunId"
MODEL_URI_TAG = "stratoflow.model_uri"
VERSION_TAG = "stratoflow.registered_version"
# On a model version: the version an alias pointed to before this one took it (`<prefix><alias>`).
PREVIOUS_ALIAS_TAG = "stratoflow.previous."
# Strategy benchmark runs: a parent run per DAG run, a child run per strategy.
KIND_TAG = "stratoflow.kind"
BENCHMARK_PARENT_KIND = "strategy_benchmark"
BENCHMARK_CHILD_KIND = "strategy_benchmark_run"
BENCHMARK_STRATEGIES_TAG = "stratoflow.benchmark_strategies"
RECOMMENDED_TAG = "stratoflow.recommended_strategy"
REASON_TAG = "stratoflow.recommendation_reason"
ERROR_TAG = "stratoflow.error"
# The evaluation gate's verdict on the run, and which checks failed (their names, `; `-joined).
GATE_PASSED_TAG = "gate.passed"
GATE_REASONS_TAG = "gate.reasons"
GATE_FAILED_TAG = "gate.failed_checks"
# The serving check (on the run and on its model version): `passed`, or `failed: <why>`; and its
# duration (a run metric).
SERVING_CHECK_TAG = "stratoflow.serving_check"
SERVING_CHECK_SECONDS_METRIC = "serving_check_seconds"

# Each cluster member's node (member name -> "ip (hostname)"), as JSON in every member's
# environment; written into environment.json.
NODES_ENV = "STRATOFLOW_NODES"

# MLflow metrics logged once per epoch (training runs and strategy benchmark children), for a
# classification pipeline; a pipeline's problem type decides the epoch metric (`epoch_metric`).
EPOCH_METRICS = ("loss", "accuracy", "val_loss", "val_accuracy", "examples_per_second")
# The epoch metric of each task: `<metric>` on the training batches, `val_<metric>` on validation.
EPOCH_METRIC_OF_PROBLEM_TYPE = {"classification": "accuracy", "regression": "mae"}

# MLflow artifacts of a retrain run.
CONFIG_JSON_ARTIFACT = "config.json"
CONFIG_YAML_ARTIFACT = "config.yaml"
ENVIRONMENT_ARTIFACT = "environment.json"
CURVES_ARTIFACT = "curves.png"
CONFUSION_MATRIX_ARTIFACT = "confusion_matrix.png"
RESIDUALS_ARTIFACT = "residuals.png"
PER_CLASS_ARTIFACT = "evaluation/per_class.json"
TEST_METRICS_ARTIFACT = "evaluation/test_metrics.json"
# The statistics of every prepared split (the champion's run holds those of the data it was
# trained on), and the data gate's report.
STATISTICS_ARTIFACT = "data/statistics.json"
STATISTICS_HTML_ARTIFACT = "data/statistics.html"
# A registered version's tag: where the statistics of the data it was trained on are.
STATISTICS_VERSION_TAG = "stratoflow.statistics"
DATA_GATE_ARTIFACT = "data/gate.json"
DATA_GATE_HTML_ARTIFACT = "data/gate.html"
# MLflow run tags and metric of the data gate.
DATA_GATE_PASSED_TAG = "data_gate.passed"
DATA_GATE_ACCEPTED_TAG = "data_gate.accepted_drift"
DATA_GATE_ANOMALIES_TAG = "data_gate.anomalies"
DATA_GATE_CHAMPION_TAG = "data_gate.champion_version"
STATISTICS_SECONDS_METRIC = "statistics_seconds"
# The gate's report: whole (JSON), one row per check (an MLflow table), and the slices' scores.
GATE_REPORT_ARTIFACT = "evaluation/gate.json"
GATE_TABLE_ARTIFACT = "evaluation/gate_checks.json"
# MLflow artifacts of a strategy benchmark's parent run.
BENCHMARK_PLAN_ARTIFACT = "benchmark/plan.json"
BENCHMARK_COMPARISON_ARTIFACT = "benchmark/comparison.json"
BENCHMARK_MARKDOWN_ARTIFACT = "benchmark/comparison.md"
BENCHMARK_TABLE_ARTIFACT = "benchmark/comparison_table.json"

# The Params of a strategy benchmark DAG (a retrain DAG's are the `TrainingConfig` fields).


def slice_metric(slice_name: str, metric: str) -> str:
    """The MLflow metric holding `metric` of test slice `slice_name`: `test_slice/class_3/accuracy`
    (`examples` for its size)."""
    return f"test_slice/{slice_name}/{metric}"


def retrain_dag_id(pipeline: str) -> str:
    """The retrain DAG of `pipeline`: `retrain_mnist`."""
    return f"{RETRAIN_DAG_PREFIX}{pipeline}"


def benchmark_dag_id(pipeline: str) -> str:
    """The strategy benchmark DAG of `pipeline`: `benchmark_strategies_mnist`."""
    return f"{BENCHMARK_DAG_PREFIX}{pipeline}"


def refresh_dag_id(dataset: str) -> str:
    """The DAG refreshing `dataset` and emitting its asset event: `refresh_stratoflow_digits`."""
    return f"{REFRESH_DAG_PREFIX}{dataset}"


def asset_name(dataset: str) -> str:
    """The asset name of TFDS dataset `dataset`: the dataset name itself."""
    return dataset


def asset_uri(dataset: str) -> str:
    """The asset URI of TFDS dataset `dataset`, e.g. `x-tfds://stratoflow_digits`."""
    return f"{ASSET_URI_SCHEME}://{dataset}"


def experiment_name(pipeline: str) -> str:
    """The MLflow experiment of `pipeline`'s retrain and benchmark runs: `stratoflow/mnist`."""
    return f"stratoflow/{pipeline}"


def epoch_metric(problem_type: str) -> str:
    """The epoch metric of a problem type: `accuracy` (classification), `mae` (regression)."""
    return EPOCH_METRIC_OF_PROBLEM_TYPE[problem_type]


def epoch_metrics(problem_type: str) -> tuple[str, ...]:
    """The metrics logged once per epoch for a task (`loss`, `<metric>`, `val_loss`, ...)."""
    metric = epoch_metric(problem_type)
    return ("loss", metric, "val_loss", f"val_{metric}", "examples_per_second")
