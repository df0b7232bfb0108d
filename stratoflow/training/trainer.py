"""Training under a `tf.distribute` strategy: the custom loop (default) and Keras `fit`.

Both loops see the same data in the same order (the training split is reshuffled each epoch with
`seed + epoch`; cached in memory or streamed from its files: `stratoflow.data.input_pipeline`),
checkpoint after every epoch with `tf.train.CheckpointManager`, and resume at the first epoch not
yet saved. What happens at the end of an epoch beyond the checkpoint (e.g. logging to MLflow) is
the caller's `on_epoch_end`, so this module knows nothing of MLflow.

Run it in the process that owns TensorFlow's devices: `stratoflow.training.worker` is that process.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorflow as tf

from stratoflow.config.spec import PipelineSpec
from stratoflow.config.strategies import STRATEGIES
from stratoflow.config.training import DEFAULT_CACHE_BUDGET_MB
from stratoflow.data.datasets import DatasetRef
from stratoflow.data.input_pipeline import MIB, TrainingInput, validation_batches
from stratoflow.distributed.cluster import this_process_is_chief, workers_in_cluster
from stratoflow.distributed.protocol import (
    FIRST_STEP_MARKER,
    PROCESS_START_ENV,
    READY_MARKER,
    TrainingResult,
    announce,
)
from stratoflow.training.models import build_pipeline_model
from stratoflow.training.objectives import Objective, make_optimizer
from stratoflow.training.strategies import make_strategy

logger = logging.getLogger(__name__)

EVAL_BATCH_SIZE = 256


@dataclass
class EpochMetrics:
    """What one epoch produced; `epoch` counts from 1 (it is the MLflow step).

    `metric` is the objective's epoch metric (`metric_name`: `accuracy` or `mae`) on the
    training batches, `val_metric` on the validation split; `to_dict` names them so.
    """

    epoch: int
    loss: float
    metric: float
    val_loss: float
    val_metric: float
    examples_per_second: float
    seconds: float
    metric_name: str = "accuracy"

    def to_dict(self) -> dict[str, float]:
        """The history entry: `epoch`, `loss`, `<metric>`, `val_loss`, `val_<metric>`, ..."""
        return {
            "epoch": self.epoch,
            "loss": self.loss,
            self.metric_name: self.metric,
            "val_loss": self.val_loss,
            f"val_{self.metric_name}": self.val_metric,
            "examples_per_second": self.examples_per_second,
            "seconds": self.seconds,
        }


EpochCallback = Callable[[EpochMetrics], None]


def read_training_statistics(run_dir: Path) -> Any:
    """The training split's statistics the run's first task wrote into `run_dir`, or None."""
    from stratoflow.data.statistics import STATISTICS_FILE, DatasetStatistics

    path = run_dir / STATISTICS_FILE
    if not path.is_file():
        return None
    return DatasetStatistics.from_dict(json.loads(path.read_text())).train


def train(
    spec: PipelineSpec,
    dataset: DatasetRef,
    run_dir: Path,
    on_epoch_end: EpochCallback | None = None,
    *,
    strategy: Any = None,
    record_steps: int = 0,
) -> TrainingResult:
    """Train `spec.model` on `dataset` under `spec.training`, resuming from `run_dir` checkpoints.

    Args:
        spec: the resolved pipeline config (training overrides already applied).
        dataset: the prepared dataset.
        run_dir: the run-scoped folder: `checkpoints/`, `history.json`, `model.keras`.
        on_epoch_end: called after each epoch's checkpoint is saved.
        strategy: a strategy this process already made for `spec.training` (a multi-worker
            strategy can be made only once per process); made here when None.
        record_steps: a diagnostic: the loss of each of the first `record_steps` steps of the
            first epoch trained goes to `TrainingResult.step_losses` (custom loop, synchronous
            strategies). Those steps run one call each, so the start of the run is slower.

    Returns:
        Where the model was saved, the per-epoch history and the strategy's shape.

    Raises:
        ValueError: `record_steps` with `fit` or a coordinated strategy (`parameter_server`).
    """
    training = spec.training
    described = STRATEGIES[training.strategy]
    if record_steps and (training.loop == "fit" or described.coordinated):
        raise ValueError(
            "record_steps needs the custom loop and a synchronous strategy; got loop "
            f"{training.loop!r}, strategy {training.strategy!r}"
        )
    if strategy is None:
        # Multi-worker strategies must exist before any other TensorFlow op runs.
        strategy = make_strategy(training)
        announce(READY_MARKER)  # the launcher times its peers' start-up from this
    tf.keras.utils.set_random_seed(training.seed)
    chief = this_process_is_chief()
    run_dir.mkdir(parents=True, exist_ok=True)
    replicas = strategy.num_replicas_in_sync
    if training.batch_size % replicas:
        raise ValueError(
            f"batch_size {training.batch_size} must be divisible by the {replicas} replicas"
        )

    objective = Objective(dataset.target.task)
    statistics = read_training_statistics(run_dir)
    with strategy.scope():
        model = build_pipeline_model(spec, dataset, statistics)
        optimizer = make_optimizer(spec.optimizer, training.learning_rate)
        optimizer.build(model.trainable_variables)
        if training.loop == "fit":
            model.compile(
                optimizer=optimizer,
                loss=objective.keras_loss(),
                metrics=[objective.keras_metric()],
            )
    if described.refuses_random_layers:
        _refuse_random_layers(model, training.strategy)

    # Every worker restores the chief's checkpoint; only the chief's own saves are kept.
    # A non-chief's scratch goes on success and on error (the launcher's work folder, its
    # TMPDIR, catches what a killed worker leaves).
    scratch = None if chief else Path(tempfile.mkdtemp(prefix="stratoflow-worker-"))
    try:
        store = _CheckpointStore(run_dir, model, optimizer, write_dir=scratch)
        start_epoch = store.restore()
        steps_per_epoch = dataset.split_sizes["train"] // training.batch_size
        if steps_per_epoch == 0:
            raise ValueError(
                f"batch_size {training.batch_size} exceeds the {dataset.split_sizes['train']} "
                "training examples"
            )
        remote = described.input_sharding == "per_worker"
        epoch_batches = make_epoch_batches(
            dataset,
            training.batch_size,
            training.seed,
            remote=remote,
            cache_budget_mb=training.cache_budget_mb,
        )
        # One budget for the process: validation gets what a cached training split left.
        train_plan = epoch_batches.plan
        left = training.cache_budget_mb * MIB
        if train_plan.cached and not remote:
            left -= train_plan.estimated_bytes
        validation, _ = validation_batches(dataset, EVAL_BATCH_SIZE, left)

        run_epoch: Callable[[int, Callable[[], None]], tuple[float, float]]
        if training.loop == "fit":
            run_epoch = _FitEpoch(model, epoch_batches, objective.metric)
        else:
            # Both loops take the same inputs; parameter-server steps are scheduled remotely.
            epoch_type = _ParameterServerEpoch if described.coordinated else CustomLoopEpoch
            run_epoch = epoch_type(
                strategy,
                model,
                optimizer,
                training.batch_size,
                epoch_batches,
                steps_per_epoch,
                objective,
            )
            if isinstance(run_epoch, CustomLoopEpoch):
                run_epoch.last_epoch = training.epochs  # no batches read for an epoch not run
                run_epoch.record_steps = record_steps
        evaluate = make_evaluator(model, objective)

        result = TrainingResult(
            model_path=str(run_dir / "model.keras"),
            strategy=training.strategy,
            loop=training.loop,
            num_replicas=replicas,
            num_workers=workers_in_cluster(),
            global_batch_size=training.batch_size,
            epochs=training.epochs,
            resumed_from_epoch=start_epoch,
            history=list(store.history),
        )
        if start_epoch:
            logger.info(
                "resuming at epoch %d/%d from %s", start_epoch + 1, training.epochs, store.directory
            )
        first_step = _FirstStep(float(os.environ.get(PROCESS_START_ENV, time.time())))
        step_losses: list[float] = []
        train_start = time.perf_counter()
        for epoch in range(start_epoch + 1, training.epochs + 1):
            epoch_start = time.perf_counter()
            loss, metric = run_epoch(epoch, first_step.note)
            seconds = time.perf_counter() - epoch_start
            # Validation has no collective ops: the chief alone does it.
            val_loss, val_metric = evaluate(validation) if chief else (float("nan"),) * 2
            metrics = EpochMetrics(
                epoch=epoch,
                loss=loss,
                metric=metric,
                val_loss=val_loss,
                val_metric=val_metric,
                examples_per_second=steps_per_epoch * training.batch_size / seconds,
                seconds=seconds,
                metric_name=objective.metric,
            )
            store.save(epoch, metrics)
            result.history.append(metrics.to_dict())
            if isinstance(run_epoch, CustomLoopEpoch) and run_epoch.step_losses:
                step_losses, run_epoch.record_steps = run_epoch.step_losses, 0
            if (
                chief and on_epoch_end
            ):  # e.g. the progress line and MLflow (stratoflow.training.worker)
                on_epoch_end(metrics)
        result = dataclasses.replace(
            result,
            seconds_to_first_step=first_step.seconds,
            train_seconds=time.perf_counter() - train_start,
            # ru_maxrss is in KiB on Linux.
            peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            step_losses=step_losses,
        )

        if chief:
            model.save(result.model_path)
        return result
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def make_epoch_batches(
    dataset: DatasetRef,
    batch_size: int,
    seed: int,
    remote: bool = False,
    *,
    cache_budget_mb: int = DEFAULT_CACHE_BUDGET_MB,
) -> TrainingInput:
    """The training input: epoch → that epoch's batches (shuffled with `seed + epoch`).

    The split is cached in memory and fully reshuffled each epoch when its decoded examples fit
    `cache_budget_mb`, else streamed from the prepared files through a bounded shuffle buffer
    (`stratoflow.data.input_pipeline`).

    Args:
        dataset: the prepared dataset.
        batch_size: the global batch; a partial last batch is dropped.
        seed: the run's seed.
        remote: parameter-server input, built by each worker itself.
        cache_budget_mb: the memory the training split may take when cached, in MiB.
    """
    return TrainingInput(dataset, batch_size, seed, cache_budget_mb * MIB, remote=remote)


def _refuse_random_layers(model: Any, strategy: str) -> None:
    random_layers = [
        layer.name for layer in model.layers if isinstance(layer, tf.keras.layers.Dropout)
    ]
    if random_layers:
        raise ValueError(
            f"strategy {strategy!r} cannot train layers that draw random numbers "
            f"({', '.join(random_layers)}: TensorFlow's CentralStorage fails on them); set "
            "model.hyperparameters.dropout to 0, or choose mirrored"
        )


class _FirstStep:
    """When the first step was done, in seconds from the cluster's start."""

    def __init__(self, process_start: float):
        self.process_start = process_start
        self.seconds: float | None = None

    def note(self) -> None:
        if self.seconds is None:
            self.seconds = time.time() - self.process_start
            # The launcher times a restarted cluster's recovery up to this line.
            announce(FIRST_STEP_MARKER)


def _make_step_fn(
    model: Any, optimizer: Any, global_batch_size: int, objective: Objective
) -> Callable[..., Any]:
    """One replica's step: forward, loss scaled by the global batch, gradients applied.

    Returns the scaled loss and the batch's sum of the objective's epoch metric (e.g. the number
    of correct predictions).
    """

    def step_fn(features: Any, targets: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            outputs = model(features, training=True)
            per_example_loss = objective.per_example_loss(targets, outputs)
            loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        gradients = tape.gradient(loss, model.trainable_variables)
        # The Keras 3 optimizer all-reduces the gradients across replicas itself.
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss, objective.metric_sum(targets, outputs)

    return step_fn


def _make_train_step(strategy: Any, step_fn: Callable[..., Any]) -> Any:
    """`strategy.run` of one step on the next batch of `iterator`; loss and correct count summed."""

    @tf.function
    def train_step(iterator: Any) -> tuple[tf.Tensor, tf.Tensor]:
        per_replica_loss, per_replica_correct = strategy.run(step_fn, args=next(iterator))
        return (
            strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None),
            strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_correct, axis=None),
        )

    return train_step


class CustomLoopEpoch:
    """One epoch of the custom loop: `strategy.run` per step, losses scaled by the global batch.

    The steps run inside one `tf.function` (a `tf.range` loop over the batch iterator, as Keras'
    `steps_per_execution` does): one call for the first step (it marks the first step done), one
    for the rest of the epoch. No Python runs between steps, which is where a per-step call lost
    time to `fit`; the batches, their order and the number of steps are the same as one call per
    step, and so are the sums (same order of float additions).

    Public for the benchmarks (`benchmarks/in_process.py`), which time this very loop against
    Keras `fit` and a plain loop: `CustomLoopEpoch(...)(epoch, first_step_done)` runs one epoch
    and returns its mean loss and its epoch metric (the objective's `metric`).
    """

    def __init__(
        self,
        strategy: Any,
        model: Any,
        optimizer: Any,
        global_batch_size: int,
        epoch_batches: Callable[[int], tf.data.Dataset],
        steps: int,
        objective: Objective,
        last_epoch: int | None = None,
    ):
        self.strategy = strategy
        self.epoch_batches = epoch_batches
        self.global_batch_size = global_batch_size
        self.steps = steps
        self.last_epoch = last_epoch
        # A cached split's epochs come from one iterator, kept between calls (`_iterator_for`).
        self._kept_iterator: Any = None
        self._kept_iterator_epoch = 0  # the epoch the kept iterator's next batches are
        # One replica on the CPU: the distributed-dataset wrapper only adds per-batch work (measured
        # at 5-10 % of the epoch here), so the loop reads the batches directly.
        self.distribute_input = strategy.num_replicas_in_sync > 1 or bool(
            tf.config.list_logical_devices("GPU")
        )
        step_fn = _make_step_fn(model, optimizer, global_batch_size, objective)

        @tf.function
        def run_steps(
            iterator: Any, steps: tf.Tensor, total_loss: tf.Tensor, total_correct: tf.Tensor
        ) -> tuple[tf.Tensor, tf.Tensor]:
            # `steps` is a tensor: the one-step and the rest-of-epoch calls share one trace.
            for _ in tf.range(steps):
                per_replica_loss, per_replica_correct = strategy.run(step_fn, args=next(iterator))
                total_loss += strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, None)
                total_correct += strategy.reduce(
                    tf.distribute.ReduceOp.SUM, per_replica_correct, None
                )
            return total_loss, total_correct

        self.run_steps = run_steps
        # Diagnostic (`train(record_steps=...)`): the first steps one call each, their losses kept.
        self.record_steps = 0
        self.step_losses: list[float] = []

    def _iterator_for(self, epoch: int) -> Any:
        """An iterator whose next `steps` batches are epoch `epoch`'s.

        A cached split's epochs run on in one iterator (`TrainingInput.epochs`), kept for the
        next epoch: its shuffle buffer fills while this epoch ends. Any other input: an iterator
        per epoch.
        """
        source = self.epoch_batches
        if isinstance(source, TrainingInput) and source.epochs_run_on:
            if self._kept_iterator is None or epoch != self._kept_iterator_epoch:
                epochs = source.epochs(epoch, self.last_epoch)
                if self.distribute_input:
                    epochs = self.strategy.experimental_distribute_dataset(epochs)
                self._kept_iterator = iter(epochs)
            self._kept_iterator_epoch = epoch + 1
            return self._kept_iterator
        if not self.distribute_input:
            return iter(source(epoch))
        if isinstance(source, TrainingInput):
            # A streamed split is sharded by file across workers where it can be.
            return iter(source.distribute(self.strategy, epoch))
        return iter(self.strategy.experimental_distribute_dataset(source(epoch)))

    def __call__(self, epoch: int, first_step_done: Callable[[], None]) -> tuple[float, float]:
        iterator = self._iterator_for(epoch)
        # Sums stay tensors: reading a value each step would stall the host on every step.
        total_loss, total_correct = self.run_steps(
            iterator, tf.constant(1), tf.constant(0.0), tf.constant(0.0)
        )
        total_loss.numpy()
        first_step_done()
        done = 1
        if self.record_steps:
            # The same traced steps and the same float additions as the call below makes.
            self.step_losses = [float(total_loss)]
            done = min(self.record_steps, self.steps)
            for _ in range(done - 1):
                before = total_loss
                total_loss, total_correct = self.run_steps(
                    iterator, tf.constant(1), tf.constant(0.0), total_correct
                )
                self.step_losses.append(float(total_loss))
                total_loss = before + total_loss
        total_loss, total_correct = self.run_steps(
            iterator, tf.constant(self.steps - done), total_loss, total_correct
        )
        return float(total_loss) / self.steps, float(total_correct) / (
            self.steps * self.global_batch_size
        )


class _ParameterServerEpoch:
    """One epoch of asynchronous training: `steps` steps, each run by whichever worker is free.

    Each worker iterates its own, independently shuffled copy of the training split
    (`create_per_worker_dataset`) and one step is one worker's whole global batch; an epoch is
    `train examples // batch_size` steps, so it sees about one pass of the split, not exactly one.
    """

    def __init__(
        self,
        strategy: Any,
        model: Any,
        optimizer: Any,
        global_batch_size: int,
        epoch_batches: Callable[[int], tf.data.Dataset],
        steps: int,
        objective: Objective,
    ):
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        self.epoch_batches = epoch_batches
        self.steps = steps
        self.global_batch_size = global_batch_size
        step_fn = _make_step_fn(model, optimizer, global_batch_size, objective)
        self.train_step = _make_train_step(strategy, step_fn)

    def __call__(self, epoch: int, first_step_done: Callable[[], None]) -> tuple[float, float]:
        per_worker = self.coordinator.create_per_worker_dataset(
            lambda: self.epoch_batches(epoch).repeat()
        )
        iterator = iter(per_worker)
        scheduled = [
            self.coordinator.schedule(self.train_step, args=(iterator,)) for _ in range(self.steps)
        ]
        scheduled[0].fetch()
        first_step_done()
        self.coordinator.join()  # raises at once if a ps died; a dead worker's steps are rerun
        losses, corrects = zip(*(step.fetch() for step in scheduled), strict=True)
        examples = self.steps * self.global_batch_size
        return float(sum(losses)) / self.steps, float(sum(corrects)) / examples


class _FitEpoch:
    """One epoch of Keras `fit` on the same batches the custom loop would see."""

    def __init__(self, model: Any, epoch_batches: Callable[[int], tf.data.Dataset], metric: str):
        self.model = model
        self.epoch_batches = epoch_batches
        self.metric = metric

    def __call__(self, epoch: int, first_step_done: Callable[[], None]) -> tuple[float, float]:
        class FirstStep(tf.keras.callbacks.Callback):
            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                if batch == 0:
                    first_step_done()

        history = self.model.fit(
            self.epoch_batches(epoch), epochs=1, verbose=0, callbacks=[FirstStep()]
        )
        return float(history.history["loss"][-1]), float(history.history[self.metric][-1])


def make_evaluator(
    model: Any, objective: Objective
) -> Callable[[tf.data.Dataset], tuple[float, float]]:
    """Mean loss and epoch metric over a batched split: a plain forward pass, on every strategy.

    Public for the benchmarks, which run it between epochs as the trainer does.
    """

    @tf.function
    def batch_totals(features: Any, targets: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        outputs = model(features, training=False)
        losses = objective.per_example_loss(targets, outputs)
        return tf.reduce_sum(losses), objective.metric_sum(targets, outputs)

    def evaluate(batches: tf.data.Dataset) -> tuple[float, float]:
        total_loss = total_metric = 0.0
        count = 0
        for features, targets in batches:
            loss, metric = batch_totals(features, targets)
            total_loss += float(loss)
            total_metric += float(metric)
            count += int(targets.shape[0])
        return total_loss / count, total_metric / count

    return evaluate


class _CheckpointStore:
    """Per-epoch checkpoints plus the metrics of the epochs they cover, in the run folder.

    A non-chief worker of a multi-worker run restores the chief's checkpoint like everyone, but
    writes its own saves (which the collective save needs) to `write_dir`, a scratch folder.
    """

    def __init__(self, run_dir: Path, model: Any, optimizer: Any, write_dir: Path | None = None):
        self.directory = run_dir / "checkpoints"
        self.history_path = run_dir / "history.json"
        self.writes_history = write_dir is None
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="completed_epochs")
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=self.epoch)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, str(write_dir or self.directory), max_to_keep=2
        )
        self.history: list[dict[str, float]] = []

    def restore(self) -> int:
        """Restore the latest checkpoint, if any; returns the number of completed epochs."""
        latest = tf.train.latest_checkpoint(str(self.directory))
        if not latest:
            return 0
        self.checkpoint.restore(latest).assert_existing_objects_matched()
        self.history = read_history(self.history_path.parent)
        return int(self.epoch.numpy())

    def save(self, epoch: int, metrics: EpochMetrics) -> None:
        self.history.append(metrics.to_dict())
        if self.writes_history:
            # History first: `restore` drops entries past the last checkpoint, so a crash between
            # the two writes redoes the epoch instead of resuming without its metrics.
            temporary = self.history_path.with_suffix(".tmp")
            temporary.write_text(json.dumps(self.history, indent=1))
            os.replace(temporary, self.history_path)
        self.epoch.assign(epoch)
        self.manager.save(checkpoint_number=epoch)


def read_history(run_dir: Path) -> list[dict[str, float]]:
    """The per-epoch metrics of the epochs `run_dir`'s latest checkpoint covers (empty if none)."""
    completed = _checkpointed_epochs(run_dir / "checkpoints")
    path = run_dir / "history.json"
    saved = json.loads(path.read_text()) if path.exists() else []
    return [entry for entry in saved if entry["epoch"] <= completed]


def _checkpointed_epochs(directory: Path) -> int:
    """The epoch number of the latest checkpoint (they are saved as `ckpt-<epoch>`), or 0."""
    latest = tf.train.latest_checkpoint(str(directory))
    return int(latest.rsplit("-", 1)[1]) if latest else 0
