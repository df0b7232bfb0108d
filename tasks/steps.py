"""The four pipeline steps as plain functions: what each Airflow task body calls.

Every step takes the pipeline name, the DAG run's Params (the run's overrides of the spec's
training defaults), an `AirflowRun` identifying the DAG run, and the small dicts returned by the
upstream steps. It returns a small JSON-able dict (it travels through XCom). Heavy imports happen
inside, so importing this module is cheap.
"""

from __future__ import annotations

import functools
import gc
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from stratoflow.config import names, settings
from stratoflow.config.spec import PipelineSpec, load_spec
from stratoflow.training.validation import resolve_run

logger = logging.getLogger(__name__)

Step = TypeVar("Step", bound=Callable[..., Any])


def freezes_heap(step: Step) -> Step:
    """After `step`, move every object alive into the collector's permanent generation.

    A step leaves TensorFlow, Keras and MLflow imported: millions of long-lived objects that each
    later full collection walks again, and so does the interpreter's last collection at exit
    (measured: 4-7 s at the end of every `airflow dags test`, ~20 % of its main thread's time in
    the collector). Frozen objects are never scanned again; the process ends with its DAG run
    (`dags test`) or its task (a scheduler's task process), so the few cycles frozen with them
    are not worth a collection.
    """

    @functools.wraps(step)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return step(*args, **kwargs)
        finally:
            gc.freeze()

    return run  # type: ignore[return-value]


@dataclass(frozen=True)
class AirflowRun:
    """Which DAG run a step belongs to (from the Airflow context, or made up by a test)."""

    dag_id: str
    run_id: str
    try_number: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_context(cls, context: Any) -> AirflowRun:
        """The DAG run of an Airflow task context (`dag`, `run_id`, `ti`)."""
        return cls(
            dag_id=context["dag"].dag_id,
            run_id=context["run_id"],
            try_number=context["ti"].try_number,
        )


def resolve_config(pipeline: str, params: dict[str, Any]) -> PipelineSpec:
    """The pipeline spec with the run's Params applied to its training defaults, validated.

    Raises:
        SpecError: an unknown Param or an invalid value or combination (named in the message).
    """
    return resolve_run(pipeline, params, standing_cluster=settings.standing_cluster())


@freezes_heap
def prepare(pipeline: str, params: dict[str, Any], run: AirflowRun) -> dict[str, Any]:
    """Validate the run's config, build or load the dataset and open the run's MLflow run.

    Returns:
        The dataset reference (`stratoflow.data.datasets.DatasetRef` as a dict) plus
        `mlflow_run_id`.

    Raises:
        SpecError: invalid Params.
        TrackingUnavailableError: MLflow does not answer (checked in seconds, before any work).
    """
    from stratoflow.tracking import mlflow_runs

    spec = resolve_config(pipeline, params)
    mlflow_runs.check_reachable()
    from stratoflow.data import datasets  # imports TensorFlow: after the cheap checks

    reference = datasets.prepare_dataset(spec.dataset).to_dict()
    mlflow_run_id = mlflow_runs.start_or_resume_run(
        spec, run.dag_id, run.run_id, run.try_number, reference
    )
    return {**reference, "mlflow_run_id": mlflow_run_id}


@freezes_heap
def train(
    pipeline: str, params: dict[str, Any], run: AirflowRun, dataset: dict[str, Any]
) -> dict[str, Any]:
    """Train in a child process under the chosen strategy, resuming from this DAG run's checkpoints.

    Returns:
        The MLflow run id, the saved model's path and the shape of the strategy that ran.
    """
    from stratoflow.tracking import mlflow_runs

    spec = resolve_config(pipeline, params)
    mlflow_runs.check_reachable()
    mlflow_run_id = mlflow_runs.start_or_resume_run(
        spec, run.dag_id, run.run_id, run.try_number, dataset
    )
    result = run_training(spec, dataset, settings.run_dir(run.dag_id, run.run_id), mlflow_run_id)
    final = result["history"][-1] if result["history"] else {}
    return {
        "mlflow_run_id": mlflow_run_id,
        "model_path": result["model_path"],
        "num_replicas": result["num_replicas"],
        "num_workers": result["num_workers"],
        "epochs": result["epochs"],
        "resumed_from_epoch": result["resumed_from_epoch"],
        "final_epoch": final,
    }


def run_training(
    spec: PipelineSpec, dataset: dict[str, Any], run_dir: Path, mlflow_run_id: str
) -> dict[str, Any]:
    """Train `spec` in child processes, streaming each epoch into MLflow run `mlflow_run_id`.

    The processes come from `stratoflow.distributed.cluster` (one, or a local cluster), supervised
    by
    `stratoflow.distributed.launcher`; checkpoints in `run_dir` let a retry resume. Logs the run's
    shape tags and
    its timings (`train_seconds`, `peak_rss_mb`, `seconds_to_first_step`).

    Returns:
        The training process's `TrainingResult` as a dict (history, model path, shape, timings).
    """
    from stratoflow.distributed import cluster, launcher
    from stratoflow.tracking import mlflow_runs, plots

    payload = {
        "pipeline": spec.name,
        "config": _spec_as_dict(spec),
        "dataset": _dataset_reference(dataset).to_dict(),
        "run_dir": str(run_dir),
        "tracking_uri": settings.tracking_uri(),
        "mlflow_run_id": mlflow_run_id,
    }
    members, result_from = cluster.training_members(spec.training)
    result = launcher.run_cluster(members, result_from, payload)
    mlflow_runs.set_tags(
        mlflow_run_id,
        {"num_replicas": result["num_replicas"], "num_workers": result["num_workers"]},
    )
    timings = {"train_seconds": result["train_seconds"], "peak_rss_mb": result["peak_rss_mb"]}
    if result["seconds_to_first_step"] is not None:
        timings["seconds_to_first_step"] = result["seconds_to_first_step"]
    mlflow_runs.log_metrics(mlflow_run_id, timings)
    if result["history"]:
        figure = plots.training_curves(result["history"], title=_run_title(spec, result))
        mlflow_runs.log_figure(mlflow_run_id, figure, names.CURVES_ARTIFACT)
    return result


@freezes_heap
def evaluate(
    pipeline: str,
    params: dict[str, Any],
    run: AirflowRun,
    dataset: dict[str, Any],
    training: dict[str, Any],
) -> dict[str, Any]:
    """Score the model on the test split and decide the gate against the current champion."""
    from stratoflow.tracking import mlflow_runs
    from stratoflow.training import evaluation

    spec = resolve_config(pipeline, params)
    mlflow_run_id = training["mlflow_run_id"]
    result = score_test_split(
        dataset,
        training["model_path"],
        mlflow_run_id,
        title=f"{spec.name}: {spec.training.strategy}, {training['num_replicas']} replica(s)",
    )
    decision = evaluation.decide_gate(
        result.test_accuracy, spec.evaluation, mlflow_runs.champion(spec.registered_model)
    )
    mlflow_runs.set_tags(
        mlflow_run_id, {"gate.passed": decision.passed, "gate.reasons": "; ".join(decision.reasons)}
    )
    logger.info(
        "test_accuracy %.4f, test_loss %.4f; gate %s: %s",
        result.test_accuracy,
        result.test_loss,
        "passed" if decision.passed else "failed",
        "; ".join(decision.reasons),
    )
    return {
        "mlflow_run_id": mlflow_run_id,
        "test_loss": result.test_loss,
        "test_accuracy": result.test_accuracy,
        "gate": decision.to_dict(),
    }


def score_test_split(
    dataset: dict[str, Any], model_path: str, mlflow_run_id: str, title: str
) -> Any:
    """Score the saved model on the test split and log the results to `mlflow_run_id`.

    Logs the test metrics, `evaluation/test_metrics.json`, the per-class table and the confusion
    matrix figure (titled `title`).

    Returns:
        The `stratoflow.training.evaluation.EvaluationResult`.
    """
    from stratoflow.data import datasets
    from stratoflow.tracking import mlflow_runs, plots
    from stratoflow.training import evaluation

    images, labels = datasets.load_arrays(_dataset_reference(dataset), "test")
    result = evaluation.evaluate_model(model_path, images, labels)
    mlflow_runs.log_metrics(mlflow_run_id, result.metrics())
    mlflow_runs.client().log_dict(
        mlflow_run_id,
        {"per_class": result.per_class, "confusion_matrix": result.confusion_matrix},
        names.TEST_METRICS_ARTIFACT,
    )
    class_names = list(dataset["class_names"])
    mlflow_runs.log_figure(
        mlflow_run_id,
        plots.confusion_matrix(result.confusion_matrix, class_names, title=title),
        names.CONFUSION_MATRIX_ARTIFACT,
    )
    mlflow_runs.log_table(
        mlflow_run_id,
        _per_class_columns(result.per_class, class_names),
        names.PER_CLASS_ARTIFACT,
    )
    return result


@freezes_heap
def log_and_register(
    pipeline: str,
    params: dict[str, Any],
    run: AirflowRun,
    dataset: dict[str, Any],
    training: dict[str, Any],
    evaluation: dict[str, Any],
) -> dict[str, Any]:
    """Log the model to MLflow, register a version (alias challenger), promote if the gate passed.

    `champion` moves only when the gate passed and the run's `promote` Param is true.
    """
    from stratoflow.data import datasets
    from stratoflow.tracking import mlflow_runs, model_registry

    spec = resolve_config(pipeline, params)
    mlflow_run_id = training["mlflow_run_id"]
    images, _ = datasets.load_arrays(_dataset_reference(dataset), "test")
    model_uri = model_registry.log_model(mlflow_run_id, training["model_path"], images[:2])
    promote = bool(spec.training.promote and evaluation["gate"]["passed"])
    result = model_registry.register(
        spec.registered_model,
        mlflow_run_id,
        model_uri,
        promote=promote,
        tags={
            names.DAG_ID_TAG: run.dag_id,
            names.RUN_ID_TAG: run.run_id,
            "strategy": spec.training.strategy,
            "test_accuracy": f"{evaluation['test_accuracy']:.4f}",
        },
    )
    mlflow_runs.finish_run(mlflow_run_id)
    # The run succeeded: its checkpoints were only there to resume a retry.
    settings.remove_run_dir(run.dag_id, run.run_id, "checkpoints")
    logger.info(
        "%s version %s, aliases %s", result.registered_model, result.version, result.aliases
    )
    return {**result.to_dict(), "mlflow_run_id": mlflow_run_id}


def refresh_dataset(dataset: str) -> dict[str, Any]:
    """Prepare every version of TFDS dataset `dataset` the pipelines read; describe what is there.

    The refresh DAG calls this and then emits the dataset's asset event, which retrains every
    pipeline reading it. A version that is not prepared yet is built; one that is, is checked
    and fingerprinted (the fingerprint in the event tells a consumer what data it got).

    Returns:
        `{"dataset": name, "versions": {version: {"fingerprint", "built", "split_sizes"}}}`
        (the key is `config:version` for a builder config).

    Raises:
        KeyError: no pipeline reads `dataset`.
    """
    from stratoflow.config.assets import datasets_in_use
    from stratoflow.data import datasets

    specs = datasets_in_use()
    if dataset not in specs:
        raise KeyError(
            f"no pipeline reads dataset {dataset!r}; datasets in use: {', '.join(sorted(specs))}"
        )
    versions = {}
    for spec in specs[dataset]:
        reference = datasets.prepare_dataset(spec)
        key = reference.version if spec.config is None else f"{spec.config}:{reference.version}"
        versions[key] = {
            "fingerprint": reference.fingerprint,
            "built": reference.built,
            "split_sizes": reference.split_sizes,
        }
    return {"dataset": dataset, "versions": versions}


def clean_up_failed_run(pipeline: str, run: AirflowRun, tracked: bool = True) -> None:
    """After a task failed for good: mark its MLflow run failed, remove versions and checkpoints.

    Best effort: it runs in a failure callback, so it logs what it cannot undo instead of raising.

    Args:
        pipeline: the pipeline name.
        run: the failed DAG run.
        tracked: False when the run failed before any MLflow call (its first task refused the
            conf): only its folder is removed, and MLflow is not asked (importing and
            connecting to it is most of this callback's time).
    """
    settings.remove_run_dir(run.dag_id, run.run_id)
    if not tracked:
        return
    from stratoflow.tracking import mlflow_runs, model_registry

    try:
        mlflow_runs.check_reachable()
    except mlflow_runs.TrackingUnavailableError as error:
        # MLflow's own client would retry for minutes inside this callback: report and stop.
        logger.error(
            "cannot mark the MLflow run of %s failed or remove its model versions: %s",
            run.run_id,
            error,
        )
        return
    try:
        spec = load_spec(pipeline)
        mlflow_client = mlflow_runs.client()
        mlflow_run = mlflow_runs.find_run(mlflow_client, pipeline, run.dag_id, run.run_id)
        if mlflow_run is None:
            return
        model_registry.delete_versions_of_run(spec.registered_model, mlflow_run.info.run_id)
        mlflow_runs.finish_run(mlflow_run.info.run_id, status="FAILED")
    except Exception:
        logger.exception("could not clean up MLflow after the failed DAG run %s", run.run_id)


def clean_up_stopped_run(pipeline: str, run: AirflowRun) -> list[str]:
    """After a DAG run's processes were killed from outside: end its MLflow runs KILLED.

    `stratoflow run` calls it when stopped (Ctrl-C, SIGTERM), and for a DAG run an earlier,
    SIGKILLed `stratoflow run` left behind. Like `clean_up_failed_run`, it also removes the
    versions those runs registered and the DAG run's working folder (nothing can resume it).

    Returns:
        The ids of the MLflow runs it marked KILLED.

    Raises:
        TrackingUnavailableError: MLflow does not answer (the folder is removed all the same).
    """
    from stratoflow.tracking import mlflow_runs, model_registry

    settings.remove_run_dir(run.dag_id, run.run_id)
    mlflow_runs.check_reachable()
    ended = mlflow_runs.end_unfinished_runs(pipeline, run.dag_id, run.run_id, status="KILLED")
    model = load_spec(pipeline).registered_model
    for mlflow_run_id in ended:
        model_registry.delete_versions_of_run(model, mlflow_run_id)
    return ended


def _run_title(spec: PipelineSpec, result: dict[str, Any]) -> str:
    return (
        f"{spec.name}: {result['strategy']}, {result['num_replicas']} replica(s), "
        f"{result['num_workers']} worker(s), {result['loop']} loop"
    )


def _per_class_columns(
    per_class: list[dict[str, float]], class_names: list[str]
) -> dict[str, list[Any]]:
    """The per-class metrics as table columns: class, name, precision, recall, support."""
    classes = [int(row["class"]) for row in per_class]
    return {
        "class": classes,
        "name": [class_names[k] if k < len(class_names) else str(k) for k in classes],
        "precision": [row["precision"] for row in per_class],
        "recall": [row["recall"] for row in per_class],
        "support": [int(row["support"]) for row in per_class],
    }


def _spec_as_dict(spec: PipelineSpec) -> dict[str, Any]:
    data = asdict(spec)
    del data["name"]
    return data


def _dataset_reference(upstream: dict[str, Any]) -> Any:
    from stratoflow.data.datasets import DatasetRef

    return DatasetRef.from_dict({k: v for k, v in upstream.items() if k != "mlflow_run_id"})
