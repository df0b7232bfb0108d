"""Benchmarks that run inside one fresh TensorFlow process; prints one JSON object.

`python -m benchmarks.in_process single` (one logical CPU device): an epoch of stratoflow's
custom loop (`CustomLoopEpoch` under one_device, on the input `stratoflow.training.trainer.train`
builds)
vs an epoch of a bare Keras `fit` on that same tf.data input; that `fit` XLA-compiled
(`jit_compile=True`); the loop fed by in-memory tensors instead (real vs synthetic input); a
matmul probe for the achieved vs peak FLOP/s (MFU).
`python -m benchmarks.in_process mirrored` (two logical CPUs): the loop under mirrored(2) vs
under one_device.
`python -m benchmarks.in_process streaming BUDGET_MIB` (one logical CPU, `$TFDS_DATA_DIR` holding
`stratoflow_generated/bench`, see benchmarks/generated_data): one pass over a training split
larger than the cache budget, streamed by the input `train` builds, vs synthetic in-memory
tensors of the same shape, in turns of `STREAM_WINDOW` steps; and this process's peak RSS.

The variants run in turns, one epoch each per round, so a burst of load from other jobs on the
machine hits all of them alike; the first round (tracing) is not kept. After each epoch a
validation pass runs off the clock, as the trainer validates between epochs. Ratios are medians
of the per-round ratios. Wall time is the figure; CPU time (`time.process_time`, all threads) is
also reported, as it is much less sensitive to other jobs on a shared machine.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

ROUNDS = 7  # measured epochs per variant, after one warm-up epoch
MATMUL_SIZE = 2048
MATMUL_RUNS = 10


STREAM_WINDOW = 50  # steps per variant per round of the streaming comparison
STREAM_BATCH = 64


def main(mode: str, *args: str) -> None:
    from stratoflow.training.strategies import configure_host_devices

    configure_host_devices(2 if mode == "mirrored" else 1)
    if mode == "streaming":
        streaming = _streaming(int(args[0]))
        streaming["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        sys.stdout.write(json.dumps(streaming) + "\n")
        return
    from stratoflow.config.spec import load_spec
    from stratoflow.data.datasets import prepare_dataset

    spec = load_spec("mnist")
    dataset = prepare_dataset(spec.dataset)
    results: dict[str, Any] = {"mode": mode, "rounds": ROUNDS}
    if mode == "mirrored":
        results.update(_mirrored(spec, dataset))
    else:
        results.update(_single(spec, dataset))
    results["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sys.stdout.write(json.dumps(results) + "\n")


def _single(spec: Any, dataset: Any) -> dict[str, Any]:
    import tensorflow as tf

    examples = _examples_per_epoch(spec, dataset)
    one_device = tf.distribute.OneDeviceStrategy("/cpu:0")
    # Round order matters: the machine's speed can change between two epochs (other jobs), so each
    # ratio's two sides run back to back: fit, the loop, synthetic input; XLA (slow) comes last.
    timings = _round_robin(
        {
            "keras_fit": _keras_fit_epoch(spec, dataset),
            "stratoflow": _custom_epoch(spec, dataset, one_device, _real_batches(spec, dataset)),
            "synthetic_input": _custom_epoch(
                spec, dataset, one_device, _synthetic_batches(spec, dataset)
            ),
            "matmul": _matmul,
            # Keras' own default on a CPU-only host is no XLA; this measures whether it helps.
            "keras_fit_xla": _keras_fit_epoch(spec, dataset, jit_compile=True),
        },
        _validation_pass(spec, dataset),
    )
    wall, cpu = timings["wall"], timings["cpu"]
    flops_per_example = training_flops_per_example(spec, dataset)
    return {
        "examples_per_epoch": examples,
        "stratoflow_examples_per_second": _rate(examples, wall["stratoflow"]),
        "keras_fit_examples_per_second": _rate(examples, wall["keras_fit"]),
        "synthetic_input_examples_per_second": _rate(examples, wall["synthetic_input"]),
        "keras_fit_xla_examples_per_second": _rate(examples, wall["keras_fit_xla"]),
        "training_flops_per_example": flops_per_example,
        "matmul_flops_per_second": _rate(MATMUL_RUNS * 2.0 * MATMUL_SIZE**3, wall["matmul"]),
        "stratoflow_vs_keras_fit": _paired_ratio(wall["keras_fit"], wall["stratoflow"]),
        "real_vs_synthetic_input": _paired_ratio(wall["synthetic_input"], wall["stratoflow"]),
        "xla_vs_keras_fit": _paired_ratio(wall["keras_fit"], wall["keras_fit_xla"]),
        "mfu": _mfu(examples * flops_per_example, wall["stratoflow"], wall["matmul"]),
        "cpu_time": {
            "stratoflow_vs_keras_fit": _paired_ratio(cpu["keras_fit"], cpu["stratoflow"]),
            "real_vs_synthetic_input": _paired_ratio(cpu["synthetic_input"], cpu["stratoflow"]),
            "xla_vs_keras_fit": _paired_ratio(cpu["keras_fit"], cpu["keras_fit_xla"]),
            "mfu": _mfu(examples * flops_per_example, cpu["stratoflow"], cpu["matmul"]),
        },
        "seconds": timings,
    }


def _mirrored(spec: Any, dataset: Any) -> dict[str, Any]:
    import dataclasses

    from stratoflow.training.strategies import make_strategy

    examples = _examples_per_epoch(spec, dataset)
    strategies = {  # as stratoflow's training process makes them
        name: make_strategy(dataclasses.replace(spec.training, strategy=name, replicas=2))
        for name in ("mirrored", "one_device")
    }
    timings = _round_robin(
        {
            name: _custom_epoch(spec, dataset, strategy, _real_batches(spec, dataset))
            for name, strategy in strategies.items()
        },
        _validation_pass(spec, dataset),
    )
    wall, cpu = timings["wall"], timings["cpu"]
    return {
        "mirrored_examples_per_second": _rate(examples, wall["mirrored"]),
        "one_device_examples_per_second": _rate(examples, wall["one_device"]),
        "mirrored_vs_one_device": _paired_ratio(wall["one_device"], wall["mirrored"]),
        "cpu_time": {"mirrored_vs_one_device": _paired_ratio(cpu["one_device"], cpu["mirrored"])},
        "seconds": timings,
    }


def _streaming(budget_mib: int) -> dict[str, Any]:
    """Streamed input vs synthetic tensors, in turns of `STREAM_WINDOW` steps, over one pass."""
    import dataclasses

    import numpy as np
    import tensorflow as tf

    from benchmarks.generated_data import NAME
    from stratoflow.config import locations
    from stratoflow.config.spec import DatasetSpec, load_spec
    from stratoflow.data.datasets import prepare_dataset
    from stratoflow.training.objectives import Objective
    from stratoflow.training.trainer import CustomLoopEpoch, make_epoch_batches

    dataset = prepare_dataset(DatasetSpec(NAME, "1.0.0", "bench"), locations.data_dir())
    base = load_spec("mnist")  # its model (small_cnn), its seed and learning rate
    spec = dataclasses.replace(
        base, training=dataclasses.replace(base.training, batch_size=STREAM_BATCH)
    )
    streamed = make_epoch_batches(
        dataset, STREAM_BATCH, spec.training.seed, cache_budget_mb=budget_mib
    )
    plan = streamed.plan
    # Synthetic: 64 batches of noise of the same shape, repeated (12 KiB x 4,096 in memory).
    rng = np.random.default_rng(0)
    shape = tuple(dataset.features.shape)
    synthetic = (
        tf.data.Dataset.from_tensor_slices(
            (
                rng.uniform(0, 1, (64 * STREAM_BATCH, *shape)).astype(np.float32),
                rng.integers(0, len(dataset.target.class_names), 64 * STREAM_BATCH),
            )
        )
        .batch(STREAM_BATCH, drop_remainder=True)
        .cache()
        .repeat()
    )
    one_device = tf.distribute.OneDeviceStrategy("/cpu:0")
    steps = plan.examples // STREAM_BATCH
    loops, iterators = {}, {}
    for name, batches in (("streamed", streamed(1)), ("synthetic", synthetic)):
        with one_device.scope():
            model, optimizer = _new_model(spec, dataset)
        # Its traced steps only (`run_steps`), on one iterator that runs through the whole pass.
        loops[name] = CustomLoopEpoch(
            one_device,
            model,
            optimizer,
            STREAM_BATCH,
            streamed,
            steps,
            Objective(dataset.target.task),
        )
        iterators[name] = iter(batches)
    wall: dict[str, list[float]] = {name: [] for name in loops}
    cpu: dict[str, list[float]] = {name: [] for name in loops}
    rounds = steps // STREAM_WINDOW
    for round_index in range(rounds):
        for name, loop in loops.items():
            wall_start, cpu_start = time.perf_counter(), time.process_time()
            total, _ = loop.run_steps(
                iterators[name], tf.constant(STREAM_WINDOW), tf.constant(0.0), tf.constant(0.0)
            )
            total.numpy()
            if round_index:  # the first round traces and fills the shuffle buffer
                wall[name].append(time.perf_counter() - wall_start)
                cpu[name].append(time.process_time() - cpu_start)
    window = STREAM_WINDOW * STREAM_BATCH
    return {
        "mode": "streaming",
        "budget_mib": budget_mib,
        "cached": plan.cached,
        "train_examples": plan.examples,
        "example_bytes": plan.example_bytes,
        "decoded_mib": plan.estimated_bytes / 2**20,
        "files": plan.files,
        "shuffle_buffer": streamed.shuffle_buffer,
        "rounds": rounds - 1,
        "examples_streamed": rounds * window,
        "streamed_examples_per_second": _rate(window, wall["streamed"]),
        "synthetic_examples_per_second": _rate(window, wall["synthetic"]),
        "streamed_vs_synthetic": _paired_ratio(wall["synthetic"], wall["streamed"]),
        "cpu_time": {"streamed_vs_synthetic": _paired_ratio(cpu["synthetic"], cpu["streamed"])},
    }


def _round_robin(
    variants: dict[str, Callable[[int], Any]], between_epochs: Callable[[], Any] = lambda: None
) -> dict[str, dict[str, list[float]]]:
    """Wall and CPU seconds of each variant's epochs, run in turns; the first round not kept.

    `between_epochs` runs after every epoch, off the clock, as the trainer validates between
    epochs (its epoch seconds do not count that either).
    """
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for epoch in range(ROUNDS + 1):
        for name, run_epoch in variants.items():
            wall_start, cpu_start = time.perf_counter(), time.process_time()
            run_epoch(epoch)
            if epoch:  # the first call traces
                wall[name].append(time.perf_counter() - wall_start)
                cpu[name].append(time.process_time() - cpu_start)
            between_epochs()
    return {"wall": wall, "cpu": cpu}


def _validation_pass(spec: Any, dataset: Any) -> Callable[[], Any]:
    """What the trainer does between two epochs: a forward pass over the validation split.

    A cached split's next epoch fills its shuffle buffer meanwhile (`TrainingInput.epochs`), as
    in a training run; without this pass it would fill during the next variant's epoch instead.
    """
    from stratoflow.data.input_pipeline import validation_batches
    from stratoflow.training.objectives import Objective
    from stratoflow.training.trainer import EVAL_BATCH_SIZE, make_evaluator

    model, _ = _new_model(spec, dataset)
    batches, _ = validation_batches(dataset, EVAL_BATCH_SIZE, 2**30)
    evaluate = make_evaluator(model, Objective(dataset.target.task))
    return lambda: evaluate(batches)


def _paired_ratio(baseline_seconds: list[float], seconds: list[float]) -> float:
    """Median over rounds of baseline time / time: each pair ran seconds apart."""
    return float(statistics.median(b / s for b, s in zip(baseline_seconds, seconds, strict=True)))


def _mfu(epoch_flops: float, epoch_seconds: list[float], matmul_seconds: list[float]) -> float:
    """The fastest epoch's FLOP/s over the fastest matmul round's: each one's least disturbed.

    A peak is what the denominator means; and other jobs slow the 2-thread matmul more than the
    training step, so a median over loaded rounds would overstate the MFU.
    """
    matmul_flops = MATMUL_RUNS * 2.0 * MATMUL_SIZE**3
    return (epoch_flops / min(epoch_seconds)) / (matmul_flops / min(matmul_seconds))


def _examples_per_epoch(spec: Any, dataset: Any) -> int:
    batch = spec.training.batch_size
    return int(dataset.split_sizes["train"] // batch * batch)


def _rate(amount: float, seconds: list[float]) -> float:
    return float(statistics.median(amount / value for value in seconds))


def _real_batches(spec: Any, dataset: Any) -> Callable[[int], Any]:
    """The very input stratoflow trains on (TFDS files, cached, reshuffled each epoch)."""
    from stratoflow.training.trainer import make_epoch_batches

    return make_epoch_batches(dataset, spec.training.batch_size, spec.training.seed)


def _synthetic_batches(spec: Any, dataset: Any) -> Callable[[int], Any]:
    """The same examples as in-memory tensors: no file reading, decoding or shuffling."""
    import tensorflow as tf

    from stratoflow.data.datasets import load_arrays

    images, labels = load_arrays(dataset, "train")
    batches = tf.data.Dataset.from_tensor_slices((images, labels)).batch(
        spec.training.batch_size, drop_remainder=True
    )
    return lambda epoch: batches


def _new_model(spec: Any, dataset: Any) -> tuple[Any, Any]:
    import tensorflow as tf

    from stratoflow.training.models import build_model

    tf.keras.utils.set_random_seed(spec.training.seed)
    model = build_model(
        spec.model.builder, dataset.features, dataset.target, spec.model.hyperparameters
    )
    optimizer = tf.keras.optimizers.Adam(spec.training.learning_rate)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def _custom_epoch(
    spec: Any, dataset: Any, strategy: Any, batches: Callable[[int], Any]
) -> Callable[[int], Any]:
    """An epoch of the loop `stratoflow.training.trainer.train` runs (`CustomLoopEpoch`), on
    `batches`."""
    from stratoflow.training.objectives import Objective
    from stratoflow.training.trainer import CustomLoopEpoch  # the very loop stratoflow trains with

    with strategy.scope():
        model, optimizer = _new_model(spec, dataset)
    batch = spec.training.batch_size
    run_epoch = CustomLoopEpoch(
        strategy,
        model,
        optimizer,
        batch,
        batches,
        dataset.split_sizes["train"] // batch,
        Objective(dataset.target.task),
    )
    return lambda epoch: run_epoch(epoch, lambda: None)


def _keras_fit_epoch(spec: Any, dataset: Any, jit_compile: Any = "auto") -> Callable[[int], Any]:
    """The baseline: a plain compiled Keras model and `fit`, nothing of stratoflow's loop.

    `jit_compile=True` compiles the train step with XLA ("auto", Keras' default, does not on CPU).
    """
    import tensorflow as tf

    model, optimizer = _new_model(spec, dataset)
    model.compile(
        optimizer=optimizer,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=jit_compile,
    )
    batches = _real_batches(spec, dataset)
    return lambda epoch: model.fit(batches(epoch), epochs=1, verbose=0)


def training_flops_per_example(spec: Any, dataset: Any) -> float:
    """Analytic FLOPs of one training example: 3 x the forward pass (forward + 2x backward)."""
    import tensorflow as tf

    from stratoflow.training.models import build_model

    model = build_model(
        spec.model.builder, dataset.features, dataset.target, spec.model.hyperparameters
    )
    forward = 0.0
    for layer in model.layers:
        if isinstance(layer, tf.keras.layers.Conv2D):
            _, height, width, channels_out = layer.output.shape
            kernel_h, kernel_w, channels_in, _ = layer.kernel.shape
            forward += 2.0 * height * width * kernel_h * kernel_w * channels_in * channels_out
        elif isinstance(layer, tf.keras.layers.Dense):
            inputs, outputs = layer.kernel.shape
            forward += 2.0 * inputs * outputs
    return 3.0 * forward


_MATMUL: dict[str, Any] = {}


def _matmul(epoch: int) -> None:
    """MATMUL_RUNS 2048 x 2048 float32 matmuls: TensorFlow's peak FLOP/s on this host."""
    import tensorflow as tf

    if not _MATMUL:
        _MATMUL["a"] = tf.random.normal((MATMUL_SIZE, MATMUL_SIZE))
        _MATMUL["b"] = tf.random.normal((MATMUL_SIZE, MATMUL_SIZE))
        _MATMUL["f"] = tf.function(lambda x, y: tf.linalg.matmul(x, y))
    for _ in range(MATMUL_RUNS):
        result = _MATMUL["f"](_MATMUL["a"], _MATMUL["b"])
    result.numpy()


if __name__ == "__main__":
    main(*sys.argv[1:])
