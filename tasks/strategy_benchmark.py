"""The strategy benchmark's task bodies: plan the strategies, train one, compare them all.

The benchmark DAG (`stratoflow/dags/benchmark_strategies.py`) trains the pipeline's model briefly
under every strategy this host can run, with the same seed, each in its own training processes, and
recommends one. MLflow names (a public interface, listed in docs/how-to/benchmark-strategies.md):

- a **parent run** in `stratoflow/<pipeline>`, run name `<pipeline>-bench-<airflow run id>`,
  tags `stratoflow.kind=strategy_benchmark`, `airflow.dag_id`, `airflow.run_id`; at the end
  `stratoflow.recommended_strategy` and `stratoflow.recommendation_reason`, and the artifacts
  `benchmark/plan.json`, `benchmark/comparison.json`, `benchmark/comparison.md` and the table
  `benchmark/comparison_table.json`;
- one **child run** per strategy, run name `<pipeline>-bench-<strategy>`, tags
  `mlflow.parentRunId`, `stratoflow.kind=strategy_benchmark_run`, `strategy` and the retrain
  run's description tags, per-epoch metrics as in retrain, then `test_accuracy`, `train_seconds`,
  `seconds_to_first_step`, `seconds_to_threshold`; a failed one has `stratoflow.error`.

Nothing here registers a model or moves an alias.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from stratoflow.config import locations, names
from stratoflow.config.params import BENCHMARK_DEFAULT_TOLERANCE, benchmark_params
from stratoflow.config.parsing import SpecError
from stratoflow.config.run_plan import RunPlan, resolve_variant
from stratoflow.config.spec import PipelineSpec, load_spec
from stratoflow.data.datasets import DatasetRef
from stratoflow.tasks.run_context import AirflowRun, XComResult
from stratoflow.training.strategy_benchmark import (
    RULE,
    HostDevices,
    plan_strategies,
    recommend,
    steady_throughput,
    threshold_reached,
)

logger = logging.getLogger(__name__)

# MLflow keeps at most 8,000 characters per tag value.
MAX_ERROR_CHARS = 6000


@dataclass(frozen=True)
class PlannedStrategy(XComResult):
    """One strategy of the plan: what its `train_strategy` task instance needs, and `compare`.

    The XCom of `plan_strategies` is a list of them, which the DAG maps `train_strategy` over.

    Attributes:
        strategy: the strategy's name (the mapped task instance is named after it).
        label: how the comparison shows it, e.g. "mirrored (2 replicas)".
        overrides: the training settings that make the benchmark's config this strategy's.
        unavailable: why this host cannot run it (its training fails at once), or None.
        parent_run_id: the benchmark's parent MLflow run.
        dataset: the dataset, prepared once by `plan`.
        run_config: the strategy's plan: the benchmark's epochs and seed and the strategy's
            overrides applied, resolved and validated once, by `plan` (an unavailable
            strategy's is only described: it is never trained).
        tolerance: the throughput tolerance of the recommendation.
    """

    strategy: str
    label: str
    overrides: dict[str, Any]
    unavailable: str | None
    parent_run_id: str
    dataset: DatasetRef
    run_config: RunPlan
    tolerance: float

    PRODUCER = names.PLAN_STRATEGIES_TASK


@dataclass(frozen=True)
class StrategyResult(XComResult):
    """What one `train_strategy` task instance reports (its numbers are in its child run)."""

    strategy: str
    mlflow_run_id: str
    test_accuracy: float

    PRODUCER = names.TRAIN_STRATEGY_TASK


@dataclass(frozen=True)
class BenchmarkOutcome(XComResult):
    """What `compare` concluded (the comparison itself is on the parent run)."""

    parent_run_id: str
    recommended_strategy: str
    succeeded: list[str]
    failed: list[str]

    PRODUCER = names.COMPARE_STRATEGIES_TASK


def benchmark_spec(pipeline: str, params: dict[str, Any]) -> PipelineSpec:
    """The pipeline spec with the benchmark's `epochs` and `seed` applied, validated.

    Called once per benchmark run, by `plan`; the result travels in each `PlannedStrategy`.

    Raises:
        SpecError: an unknown Param or an invalid value (named in the message).
    """
    allowed = list(benchmark_params())
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise SpecError(
            f"benchmark conf: unknown key {unknown[0]!r}; allowed: {', '.join(allowed)}"
        )
    tolerance = params.get("tolerance", BENCHMARK_DEFAULT_TOLERANCE)
    # A comparison with NaN is false: NaN fails the bounds here.
    if isinstance(tolerance, bool) or not (
        isinstance(tolerance, int | float) and 0 <= tolerance <= 1
    ):
        raise SpecError(
            f"benchmark conf.tolerance must be a finite number within [0, 1], got {tolerance!r}"
        )
    # The spec's training defaults are checked with the benchmark's settings, once.
    spec = load_spec(pipeline, check_settings=False)
    overrides: dict[str, Any] = {k: params[k] for k in ("epochs", "seed") if k in params}
    return resolve_variant(spec, overrides, f"{spec.source}: training").spec


def detect_host() -> HostDevices:
    """The GPUs and TPUs TensorFlow sees on this host."""
    import os

    import tensorflow as tf

    tpus = len(tf.config.list_physical_devices("TPU")) or int(bool(os.environ.get("TPU_NAME")))
    return HostDevices(gpus=len(tf.config.list_physical_devices("GPU")), tpus=tpus)


def plan(pipeline: str, params: dict[str, Any], run: AirflowRun) -> list[PlannedStrategy]:
    """List the strategies to benchmark, prepare the dataset once, open the parent MLflow run.

    The plan (and the strategies left out, with why) is also logged as `benchmark/plan.json`.

    Returns:
        The planned strategies of `stratoflow.training.strategy_benchmark.plan_strategies` (the
        DAG maps the training over them), each with the parent run, the dataset and the
        benchmark's resolved configuration.
    """
    from stratoflow.data import datasets
    from stratoflow.tracking import mlflow_runs, name_claims

    spec = benchmark_spec(pipeline, params)
    # Its runs go to the pipeline's experiment (it registers nothing): owned by the account?
    name_claims.claim_pipeline_names(spec, registered_model=False)
    planned, not_run = plan_strategies(spec, params.get("strategies") or [], detect_host())
    # Each strategy's plan, resolved now (a bad one fails here, not after the first trainings)
    # and carried to its training task.
    plans = {
        entry["strategy"]: (
            RunPlan.of(replace(spec, training=replace(spec.training, **entry["overrides"])))
            if entry["unavailable"]
            else resolve_variant(spec, entry["overrides"])
        )
        for entry in planned
    }
    prepared = datasets.prepare_dataset(spec.dataset)
    reference = prepared.to_dict()
    parent_run_id = mlflow_runs.start_or_resume_tagged_run(
        spec,
        _parent_identity(run),
        {
            "pipeline": spec.name,
            "dataset": f"{reference['name']}:{reference['version']}",
            names.BENCHMARK_STRATEGIES_TAG: ",".join(e["strategy"] for e in planned),
            names.RUN_NAME_TAG: f"{spec.name}-bench-{run.run_id}",
            **mlflow_runs.triggered_by_tag(run.triggered_by),
        },
        run.try_number,
        reference,
    )
    mlflow_client = mlflow_runs.client()
    mlflow_client.log_dict(
        parent_run_id, {"planned": planned, "not_run": not_run}, names.BENCHMARK_PLAN_ARTIFACT
    )
    mlflow_runs.log_params(parent_run_id, {"benchmark.tolerance": _tolerance(params)})
    logger.info(
        "benchmarking %s; not run here: %s",
        ", ".join(e["label"] for e in planned),
        "; ".join(f"{name} ({reason})" for name, reason in not_run.items()) or "none",
    )
    tolerance = _tolerance(params)
    return [
        PlannedStrategy(
            strategy=entry["strategy"],
            label=entry["label"],
            overrides=dict(entry["overrides"]),
            unavailable=entry["unavailable"],
            parent_run_id=parent_run_id,
            dataset=prepared,
            run_config=plans[entry["strategy"]],
            tolerance=tolerance,
        )
        for entry in planned
    ]


def train_strategy(run: AirflowRun, entry: PlannedStrategy) -> StrategyResult:
    """Train and score one planned strategy into its own child run of the parent run.

    Always from scratch (a re-run replaces the strategy's child run and checkpoints). A failure
    is recorded on the child run (status FAILED, tag `stratoflow.error`) and raised.

    Returns:
        The strategy, its child run id and its test accuracy.
    """
    from stratoflow.tasks.evaluate import score_test_split
    from stratoflow.tasks.train import run_training
    from stratoflow.tracking import mlflow_runs
    from stratoflow.training.recorded_outputs import RecordedOutputs
    from stratoflow.training.strategies import StrategyUnavailableError

    strategy_plan = entry.run_config
    spec = strategy_plan.spec
    strategy = entry.strategy
    dataset = entry.dataset
    child_run_id = _fresh_child_run(spec, run, entry.parent_run_id, dataset.to_dict())
    run_dir = locations.run_dir(run.dag_id, run.run_id) / strategy
    locations.remove_run_dir(run.dag_id, run.run_id, strategy)
    try:
        if entry.unavailable:
            raise StrategyUnavailableError(
                f"strategy {strategy!r} cannot run on this host: {entry.unavailable}"
            )
        result = run_training(strategy_plan, dataset, run_dir, child_run_id)
        evaluation = score_test_split(
            dataset,
            RecordedOutputs.load(result.test_outputs_path),
            child_run_id,
            title=f"{spec.name} benchmark: {strategy}, {result.num_replicas} replica(s)",
        )
        reached = threshold_reached(result.history, spec.evaluation.bound)
        if reached:
            mlflow_runs.log_metrics(
                child_run_id,
                {
                    "seconds_to_threshold": reached["seconds"],
                    "epochs_to_threshold": reached["epoch"],
                },
            )
        mlflow_runs.finish_run(child_run_id)
    except Exception as error:
        mlflow_runs.set_tags(
            child_run_id, {names.ERROR_TAG: _shorten(f"{type(error).__name__}: {error}")}
        )
        mlflow_runs.finish_run(child_run_id, status="FAILED")
        raise
    finally:
        locations.remove_run_dir(run.dag_id, run.run_id, strategy)  # the benchmark keeps no model
    logger.info("%s: test_accuracy %.4f", entry.label, evaluation.test_accuracy)
    return StrategyResult(
        strategy=strategy, mlflow_run_id=child_run_id, test_accuracy=evaluation.test_accuracy
    )


def compare(
    pipeline: str, run: AirflowRun, planned: list[PlannedStrategy] | None
) -> BenchmarkOutcome:
    """Read the child runs, write the comparison on the parent run and tag the recommendation.

    A strategy whose training failed (or never finished) is listed as failed with its error. The
    parent run is FINISHED when at least one strategy succeeded, else FAILED (and this raises).

    Raises:
        RuntimeError: the plan task did not succeed, or no strategy succeeded.
    """
    from stratoflow.tracking import mlflow_runs

    mlflow_client = mlflow_runs.client()
    if not planned:
        mark_parent_failed(pipeline, run)
        raise RuntimeError(
            "the benchmark's first task (plan_strategies) did not succeed, so no strategy was "
            "trained; its log says why"
        )
    spec = planned[0].run_config.spec  # epochs, seed and gate: the same in every plan
    parent_run_id = planned[0].parent_run_id
    children = {
        child.data.tags.get("strategy"): child
        for child in mlflow_client.search_runs(
            [mlflow_client.get_run(parent_run_id).info.experiment_id],
            filter_string=f"tags.`{names.PARENT_RUN_TAG}` = '{parent_run_id}'",
        )
    }
    rows = [_row(mlflow_client, entry, children.get(entry.strategy)) for entry in planned]
    tolerance = planned[0].tolerance
    recommendation = recommend(rows, tolerance)
    comparison = {
        "pipeline": pipeline,
        "airflow_run_id": run.run_id,
        "parent_run_id": parent_run_id,
        "epochs": spec.training.epochs,
        "seed": spec.training.seed,
        "threshold": spec.evaluation.bound,
        "tolerance": tolerance,
        "rule": RULE.format(tolerance=f"{tolerance:g}"),
        "strategies": rows,
        "not_run": _load_artifact(parent_run_id, names.BENCHMARK_PLAN_ARTIFACT).get("not_run")
        or {},
        "recommendation": recommendation,
    }
    write_comparison(mlflow_client, parent_run_id, comparison)
    if recommendation is None:
        mlflow_runs.finish_run(parent_run_id, status="FAILED")
        raise RuntimeError(
            "no strategy succeeded: "
            + "; ".join(f"{row['strategy']}: {row['error']}" for row in rows)
        )
    mlflow_runs.set_tags(
        parent_run_id,
        {
            names.RECOMMENDED_TAG: recommendation["strategy"],
            names.REASON_TAG: recommendation["reason"],
        },
    )
    mlflow_runs.finish_run(parent_run_id)
    logger.info("recommended for this host: %s", recommendation["reason"])
    return BenchmarkOutcome(
        parent_run_id=parent_run_id,
        recommended_strategy=recommendation["strategy"],
        succeeded=[row["strategy"] for row in rows if row["status"] == "succeeded"],
        failed=[row["strategy"] for row in rows if row["status"] != "succeeded"],
    )


def write_comparison(mlflow_client: Any, parent_run_id: str, comparison: dict[str, Any]) -> None:
    """Log the comparison on the parent run: JSON, Markdown and an MLflow table."""
    from stratoflow.training.strategy_benchmark import TABLE_COLUMNS, cells, comparison_markdown

    mlflow_client.log_dict(parent_run_id, comparison, names.BENCHMARK_COMPARISON_ARTIFACT)
    mlflow_client.log_text(
        parent_run_id, comparison_markdown(comparison), names.BENCHMARK_MARKDOWN_ARTIFACT
    )
    table_cells = [cells(row) for row in comparison["strategies"]]
    mlflow_client.log_table(
        parent_run_id,
        data={column: [line[i] for line in table_cells] for i, column in enumerate(TABLE_COLUMNS)},
        artifact_file=names.BENCHMARK_TABLE_ARTIFACT,
    )


def find_parent_run(pipeline: str, dag_id: str, run_id: str) -> Any | None:
    """The parent MLflow run of one benchmark DAG run, or None."""
    from stratoflow.tracking import mlflow_runs

    return mlflow_runs.find_tagged_run(
        mlflow_runs.client(), pipeline, _parent_identity(AirflowRun(dag_id, run_id))
    )


def read_comparison(pipeline: str, dag_id: str, run_id: str) -> dict[str, Any] | None:
    """The comparison a benchmark DAG run wrote on its parent run, or None if it wrote none."""
    parent = find_parent_run(pipeline, dag_id, run_id)
    if parent is None:
        return None
    return _load_artifact(parent.info.run_id, names.BENCHMARK_COMPARISON_ARTIFACT) or None


def _load_artifact(run_id: str, path: str) -> dict[str, Any]:
    import mlflow

    try:
        return dict(mlflow.artifacts.load_dict(f"runs:/{run_id}/{path}"))
    except Exception:  # no such artifact: the run failed before writing it
        logger.warning("run %s has no artifact %s", run_id, path)
        return {}


def mark_parent_failed(pipeline: str, run: AirflowRun) -> None:
    """After a task failed for good: mark the benchmark's parent run FAILED (best effort)."""
    from stratoflow.tracking import mlflow_runs

    try:
        parent = mlflow_runs.find_tagged_run(mlflow_runs.client(), pipeline, _parent_identity(run))
        if parent is not None:
            mlflow_runs.finish_run(parent.info.run_id, status="FAILED")
    except Exception:
        logger.exception("could not mark the benchmark run of %s failed", run.run_id)
    locations.remove_run_dir(run.dag_id, run.run_id)


def _parent_identity(run: AirflowRun) -> dict[str, str]:
    return {
        names.DAG_ID_TAG: run.dag_id,
        names.RUN_ID_TAG: run.run_id,
        names.KIND_TAG: names.BENCHMARK_PARENT_KIND,
    }


def _fresh_child_run(
    spec: PipelineSpec, run: AirflowRun, parent_run_id: str, dataset: dict[str, Any]
) -> str:
    from stratoflow.tracking import mlflow_runs

    mlflow_client = mlflow_runs.client()
    strategy = spec.training.strategy
    previous = mlflow_runs.find_tagged_run(
        mlflow_client, spec.name, {names.PARENT_RUN_TAG: parent_run_id, "strategy": strategy}
    )
    if previous is not None:  # an earlier try's numbers would mix with this one's
        mlflow_client.delete_run(previous.info.run_id)
    tags = {
        **mlflow_runs.training_tags(spec, dataset),
        names.DAG_ID_TAG: run.dag_id,
        names.RUN_ID_TAG: run.run_id,
        names.TRY_NUMBER_TAG: str(run.try_number),
        names.KIND_TAG: names.BENCHMARK_CHILD_KIND,
        names.PARENT_RUN_TAG: parent_run_id,
        names.RUN_NAME_TAG: f"{spec.name}-bench-{strategy}",
        **mlflow_runs.triggered_by_tag(run.triggered_by),
    }
    experiment_id = mlflow_runs.ensure_experiment(mlflow_client, spec.name)
    return mlflow_runs.create_described_run(mlflow_client, experiment_id, spec, tags, dataset)


def _row(mlflow_client: Any, entry: PlannedStrategy, child: Any | None) -> dict[str, Any]:
    row: dict[str, Any] = {"strategy": entry.strategy, "label": entry.label}
    if child is None:
        return {**row, "status": "failed", "error": "its training task never started"}
    row["mlflow_run_id"] = child.info.run_id
    if child.info.status != "FINISHED":
        error = child.data.tags.get(names.ERROR_TAG)
        if child.info.status != "FAILED":  # its task died before it could say so
            error = f"did not finish (MLflow status {child.info.status}): its task was killed"
            mlflow_client.set_terminated(child.info.run_id, status="FAILED")
        return {**row, "status": "failed", "error": error or "failed without a message"}
    metrics = child.data.metrics
    throughput = [
        m.value
        for m in sorted(
            mlflow_client.get_metric_history(child.info.run_id, "examples_per_second"),
            key=lambda m: m.step,
        )
    ]
    validation = sorted(
        mlflow_client.get_metric_history(child.info.run_id, "val_accuracy"), key=lambda m: m.step
    )
    return {
        **row,
        "status": "succeeded",
        "error": None,
        "epochs": len(throughput),
        "num_replicas": child.data.tags.get("num_replicas"),
        "num_workers": child.data.tags.get("num_workers"),
        "examples_per_second": steady_throughput(throughput),
        "seconds_to_first_step": metrics.get("seconds_to_first_step"),
        "train_seconds": metrics.get("train_seconds"),
        "seconds_to_threshold": metrics.get("seconds_to_threshold"),
        "epochs_to_threshold": metrics.get("epochs_to_threshold"),
        "final_val_accuracy": validation[-1].value if validation else None,
        "test_accuracy": metrics.get("test_accuracy"),
    }


def _tolerance(params: dict[str, Any]) -> float:
    return float(params.get("tolerance", BENCHMARK_DEFAULT_TOLERANCE))


def _shorten(message: str) -> str:
    if len(message) <= MAX_ERROR_CHARS:
        return message
    # Keep the head (who failed) and the tail (its last log lines).
    return message[: MAX_ERROR_CHARS // 3] + "\n…\n" + message[-(2 * MAX_ERROR_CHARS) // 3 :]
