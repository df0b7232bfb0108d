"""The retrain DAG's training task: train in child processes under the run's strategy.

`run_training` is shared with the strategy benchmark (`stratoflow.tasks.strategy_benchmark`): both
train through the same launcher, log the same metrics and draw the same curves.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from stratoflow.config import locations, names
from stratoflow.config.run_plan import RunPlan
from stratoflow.data.datasets import DatasetRef
from stratoflow.distributed.protocol import (
    EPOCH_REPORT,
    SYSTEM_REPORT,
    Restarts,
    TrainingPayload,
    TrainingResult,
)
from stratoflow.tasks.prepare import PreparedDataset
from stratoflow.tasks.run_context import AirflowRun, XComResult, freezes_heap

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainedModel(XComResult):
    """What `train` hands to the evaluation and registration tasks (the XCom of `train_model`).

    Attributes:
        mlflow_run_id: the DAG run's MLflow run.
        model_path: the saved Keras model.
        num_replicas: replicas the strategy trained on.
        num_workers: worker processes it trained in.
        epochs: epochs trained in all (this try and the ones it resumed from).
        resumed_from_epoch: the last epoch an earlier try had saved (0: none).
        final_epoch: the last epoch's metrics (empty when no epoch ran in this try).
        test_outputs_path: the saved model's outputs on the test split, its first examples and
            builds, as the training process recorded them
            (`stratoflow.training.recorded_outputs`).
    """

    mlflow_run_id: str
    model_path: str
    num_replicas: int
    num_workers: int
    epochs: int
    resumed_from_epoch: int
    final_epoch: dict[str, float] = field(default_factory=dict)
    test_outputs_path: str = ""

    PRODUCER = names.TRAIN_TASK


@freezes_heap
def train(run: AirflowRun, prepared: PreparedDataset) -> TrainedModel:
    """Train under the run's strategy, resuming from this DAG run's checkpoints.

    Args:
        run: the DAG run (its try number tells a retry).
        prepared: the first task's result: dataset, MLflow run and the run's plan.

    Raises:
        ChildProcessFailed: a training process failed, or members were lost more often than
            the run's `max_restarts` allows.
        ClusterUnreachableError: a standing cluster server does not answer.
    """
    from stratoflow.tracking import mlflow_runs

    plan = prepared.plan
    mlflow_runs.check_reachable()
    # Reopens the run (RUNNING, this try's number) after a failed try marked it FAILED.
    mlflow_run_id = mlflow_runs.start_or_resume_run(
        plan.spec,
        run.dag_id,
        run.run_id,
        run.try_number,
        prepared.dataset.to_dict(),
        triggered_by=run.triggered_by,
    )
    result = run_training(
        plan, prepared.dataset, locations.run_dir(run.dag_id, run.run_id), mlflow_run_id
    )
    return TrainedModel(
        mlflow_run_id=mlflow_run_id,
        model_path=result.model_path,
        num_replicas=result.num_replicas,
        num_workers=result.num_workers,
        epochs=result.epochs,
        resumed_from_epoch=result.resumed_from_epoch,
        final_epoch=result.history[-1] if result.history else {},
        test_outputs_path=result.test_outputs_path,
    )


def run_training(
    plan: RunPlan, dataset: DatasetRef, run_dir: Path, mlflow_run_id: str
) -> TrainingResult:
    """Train `plan` in child processes, streaming each epoch into MLflow run `mlflow_run_id`.

    The chief reports each epoch and samples of its host as it trains; this process logs them
    (`TrainingReports`), and the environment it trained in (`environment.json`) at the end.

    The processes are the plan's members (one, or a cluster), run by the plan's launcher
    (`stratoflow.distributed.launchers`): local child processes or Ray actors on a standing Ray
    cluster. A lost member is recovered up to `max_restarts` times from the checkpoints in
    `run_dir` (which also let a retry resume).
    Logs the run's shape tags, the node of every member, its timings (`train_seconds`,
    `peak_rss_mb`, `seconds_to_first_step`) and its recoveries (`restarts`, and
    `recovery_seconds` per restart), the last also when training fails.

    Returns:
        The result member's `TrainingResult` (history, model path, shape, timings, nodes).
    """
    from stratoflow.distributed.launchers import launcher_for
    from stratoflow.tasks import deployment_connections
    from stratoflow.tracking import mlflow_runs, plots, system_metrics
    from stratoflow.tracking.training_reports import TrainingReports

    payload = TrainingPayload(
        plan=plan,
        dataset=dataset.to_dict(),
        run_dir=str(run_dir),
        system_metrics_seconds=system_metrics.sampling_seconds(),
    )
    reports = TrainingReports(locations.tracking_uri(), mlflow_run_id)
    take = {EPOCH_REPORT: reports.epoch, SYSTEM_REPORT: reports.system}
    training = plan.training
    restarts = Restarts(training.max_restarts)
    try:
        result = launcher_for(training, deployment_connections.lookup).run(
            plan.cluster, payload, restarts, lambda kind, data: take[kind](data)
        )
    finally:
        _log_restarts(mlflow_run_id, restarts)
    reports.log_history(result.history)
    if result.environment:
        mlflow_runs.client().log_dict(mlflow_run_id, result.environment, names.ENVIRONMENT_ARTIFACT)
    mlflow_runs.set_tags(
        mlflow_run_id,
        {
            "num_replicas": result.num_replicas,
            "num_workers": result.num_workers,
            "launcher": training.launcher,
            **{f"node.{name.replace(' ', '_')}": node for name, node in result.nodes.items()},
        },
    )
    timings = {"train_seconds": result.train_seconds, "peak_rss_mb": result.peak_rss_mb}
    if result.seconds_to_first_step is not None:
        timings["seconds_to_first_step"] = result.seconds_to_first_step
    mlflow_runs.log_metrics(mlflow_run_id, timings)
    if result.history:
        figure = plots.training_curves(result.history, title=_run_title(plan.pipeline, result))
        mlflow_runs.log_figure(mlflow_run_id, figure, names.CURVES_ARTIFACT)
    return result


def _log_restarts(mlflow_run_id: str, restarts: Restarts) -> None:
    """`restarts` (how many), and `recovery_seconds` at step n: loss to training again."""
    from stratoflow.tracking import mlflow_runs

    mlflow_runs.log_metrics(mlflow_run_id, {"restarts": len(restarts.events)})
    for event in restarts.events:
        if event.seconds_to_recover is not None:
            mlflow_runs.log_metrics(
                mlflow_run_id, {"recovery_seconds": event.seconds_to_recover}, step=event.number
            )
        else:  # a rejoining worker still starting when the others finished: no recovery time
            logger.warning(
                "restart %d: %s was not training again when the run ended; no recovery_seconds",
                event.number,
                event.member,
            )


def _run_title(pipeline: str, result: TrainingResult) -> str:
    return (
        f"{pipeline}: {result.strategy}, {result.num_replicas} replica(s), "
        f"{result.num_workers} worker(s), {result.loop} loop"
    )
