"""Retrain a TensorFlow model and track it in MLflow: one DAG per pipeline spec.

`prepare_dataset` builds or loads the versioned TFDS dataset and computes every split's
statistics, `validate_data` checks the data against the champion's before any training (a failing
check fails the run without a retry; `accept_drift` accepts a known change), `train_model` trains
under the `tf.distribute` strategy the run chose (and records the saved model's outputs on the
test split), `evaluate_model` scores those outputs and decides the gate (its metrics and slices)
against the current champion, and `log_and_register` registers a model version in MLflow
(promoting it to `champion` only when the gate passed and the version, served in a fresh process,
answers as the evaluated model did).

A scheduled or asset-triggered run whose dataset, pipeline code and training configuration equal
the champion's skips every task, the reason in `prepare_dataset`'s log and XCom
`skipped_because`, and opens no MLflow run; a manual run, or one with `force`, trains.

A task that fails for good, a promotion and an evaluation gate that fails send a mail to the
deployment's `STRATOFLOW_NOTIFY_EMAIL` (`stratoflow/dags/notifications.py`).

A pipeline with `promotion: {approval: required}` adds `approve_promotion` and
`promote_champion`: a person approves the move of `champion` in the Airflow UI
(`stratoflow/dags/approval.py`), after the version passed the gate and the serving check.

It runs on the pipeline's cron, and whenever its dataset's asset gets an event (the DAG
`refresh_<dataset>` succeeded, or someone posted one through the REST API), whichever comes first.

Every training setting is a Param: trigger with a config such as
`{"strategy": "mirrored", "replicas": 2, "epochs": 3}`; Airflow refuses invalid values before a
run exists. A task that fails for good (retries exhausted) cleans up the run's MLflow run,
checkpoints and registered version; if its process was killed outright, the DAG run's failure
marks the MLflow run KILLED instead. A conf the spec refuses (e.g. a batch size the replicas
cannot split) fails `prepare_dataset` at once, without a retry and before any MLflow run opens.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG, AssetOrTimeSchedule, CronTriggerTimetable

from stratoflow.config import names
from stratoflow.config.assets import dataset_asset
from stratoflow.config.params import dag_params
from stratoflow.config.spec import PipelineSpec
from stratoflow.dags import approval, factory, notifications


def schedule_for(spec: PipelineSpec) -> Any:
    """The spec's cron or an event of its dataset's asset; the asset alone without a cron."""
    asset = dataset_asset(spec.dataset.name)
    if spec.schedule is None:
        return [asset]
    cron = CronTriggerTimetable(spec.schedule, timezone="UTC")
    return AssetOrTimeSchedule(timetable=cron, assets=[asset])


def _doc_md(spec: PipelineSpec) -> str:
    return "\n\n".join(
        [
            (__doc__ or "").strip(),
            f"## Pipeline `{spec.name}`",
            spec.description,
            f"- dataset: `{spec.dataset.name}` {spec.dataset.version}\n"
            f"- model builder: `{spec.model.builder}`\n"
            f"- schedule: `{spec.schedule or 'none'}` (cron, UTC) or an event of the asset "
            f"`{spec.dataset.name}`\n"
            f"- registered model: `{spec.registered_model}`\n"
            f"- task: {spec.task}\n"
            f"- evaluation gate: {_gate_text(spec)}",
        ]
    )


def _gate_text(spec: PipelineSpec) -> str:
    gate, parts = spec.evaluation, []
    for bound in gate.metrics:
        better, worse = (">=", "below") if bound.higher_is_better else ("<=", "above")
        limit = f" {better} {bound.bound}," if bound.bound is not None else ""
        parts.append(f"{bound.metric}{limit} at most {bound.max_regression} {worse} the champion")
    slices = gate.slices
    if slices is not None and (slices.per_class or slices.features):
        kinds = ["each class"] * bool(slices.per_class)
        kinds += sorted({item.feature for item in slices.features})
        parts.append(
            f"{slices.metric} of each slice ({', '.join(kinds)}) at most {slices.max_regression} "
            "worse than the champion's"
        )
    return "; ".join(parts)


def build_dag(spec: PipelineSpec) -> DAG:
    """The retraining DAG of one pipeline spec.

    Args:
        spec: the validated pipeline spec (schedule, owner, retries, tags, training defaults).

    Returns:
        The DAG `retrain_<name>` with tasks prepare_dataset → validate_data → train_model →
        evaluate_model → log_and_register (→ approve_promotion → promote_champion with approval
        required).
    """
    pipeline = spec.name
    with factory.new_dag(
        names.retrain_dag_id(pipeline),
        defaults=factory.spec_defaults(
            spec,
            on_failure_callback=notifications.with_failure_mail(
                factory.clean_up_failed_run(pipeline)
            ),
        ),
        params=dag_params(spec),
        description=spec.description,
        doc_md=_doc_md(spec),
        schedule=schedule_for(spec),
        tags=factory.spec_tags(spec),
        on_failure_callback=factory.end_runs_left_running(pipeline),
    ) as dag:
        # multiple_outputs=False: each result travels as one small dict, not one XCom per key.
        # The configuration is resolved once, by the first task, and travels in its result.

        @factory.refusing_task(task_id=names.PREPARE_TASK, multiple_outputs=False)
        def prepare_dataset(**context: Any) -> dict[str, Any]:
            from stratoflow.tasks import prepare

            run = factory.airflow_run(context)
            try:
                return prepare.prepare(pipeline, context["params"], run).to_dict()
            except prepare.NothingNew as nothing_new:
                factory.skip_the_rest(context, str(nothing_new))

        @factory.refusing_task(task_id=names.VALIDATE_DATA_TASK, multiple_outputs=False)
        def validate_data(prepared: dict[str, Any], **context: Any) -> dict[str, Any]:
            from stratoflow.tasks import validate_data
            from stratoflow.tasks.prepare import PreparedDataset

            run = factory.airflow_run(context)
            return validate_data.validate_data(run, PreparedDataset.from_dict(prepared)).to_dict()

        @factory.refusing_task(task_id=names.TRAIN_TASK, multiple_outputs=False)
        def train_model(prepared: dict[str, Any], **context: Any) -> dict[str, Any]:
            from stratoflow.tasks import train
            from stratoflow.tasks.prepare import PreparedDataset

            run = factory.airflow_run(context)
            return train.train(run, PreparedDataset.from_dict(prepared)).to_dict()

        @factory.refusing_task(task_id=names.EVALUATE_TASK, multiple_outputs=False)
        def evaluate_model(
            prepared: dict[str, Any], trained: dict[str, Any], **context: Any
        ) -> dict[str, Any]:
            from stratoflow.tasks import evaluate
            from stratoflow.tasks.prepare import PreparedDataset
            from stratoflow.tasks.train import TrainedModel

            run = factory.airflow_run(context)
            return evaluate.evaluate(
                run, PreparedDataset.from_dict(prepared), TrainedModel.from_dict(trained)
            ).to_dict()

        @factory.refusing_task(
            task_id=names.REGISTER_TASK,
            multiple_outputs=False,
            on_success_callback=notifications.on_registered,
        )
        def log_and_register_model(
            prepared: dict[str, Any],
            trained: dict[str, Any],
            evaluated: dict[str, Any],
            **context: Any,
        ) -> dict[str, Any]:
            from stratoflow.tasks import register
            from stratoflow.tasks.evaluate import Evaluation
            from stratoflow.tasks.prepare import PreparedDataset
            from stratoflow.tasks.train import TrainedModel
            from stratoflow.tracking import run_summary

            run = factory.airflow_run(context)
            registration = register.log_and_register(
                run,
                PreparedDataset.from_dict(prepared),
                TrainedModel.from_dict(trained),
                Evaluation.from_dict(evaluated),
            ).to_dict()
            # What `stratoflow run` prints, kept while MLflow is loaded here.
            run_summary.record(pipeline, run.dag_id, run.run_id)
            return registration

        # At parse time these are XComArgs standing in for the dicts the tasks will receive.
        prepared: Any = prepare_dataset()
        data_gate: Any = validate_data(prepared)
        trained: Any = train_model(prepared)
        data_gate >> trained  # the data gate decides before any training
        evaluated: Any = evaluate_model(prepared, trained)
        registered: Any = log_and_register_model(prepared, trained, evaluated)
        if spec.promotion.approval_required:
            approval.add_approval_steps(dag, spec, registered)
    return dag
