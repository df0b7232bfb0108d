"""Benchmarks that run inside one fresh TensorFlow process; prints one JSON object.

`python -m benchmarks.in_process single` (one logical CPU device): stratoflow's training run
(`tasks.training.train`, one_device, custom loop) vs a bare Keras `fit` on the same tf.data
input, the custom loop fed by the real TFDS input vs by synthetic in-memory tensors, and the
achieved FLOP/s of the training step vs TensorFlow's own matmul FLOP/s.
`python -m benchmarks.in_process mirrored` (two logical CPUs): stratoflow's run under mirrored(2)
vs the one_device custom loop.

The variants are interleaved: after each epoch of stratoflow's run, every baseline runs one
epoch (and the matmul probe runs once), so a burst of load from other jobs on the machine hits
all of them alike. The first epoch of each (tracing) is not counted; figures are medians.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROUNDS = 7  # measured epochs per variant, after one warm-up epoch
MATMUL_SIZE = 2048


def main(mode: str) -> None:
    from tasks.strategies import configure_host_devices

    configure_host_devices(2 if mode == "mirrored" else 1)
    from pipelines.spec import load_spec
    from tasks.datasets import prepare_dataset

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
    baselines = {
        "keras_fit": _keras_fit_epoch(spec, dataset),
        "real_input": _custom_epoch(spec, dataset, one_device, _real_batches(spec, dataset)),
        "synthetic_input": _custom_epoch(
            spec, dataset, one_device, _synthetic_batches(spec, dataset)
        ),
        "matmul": _matmul_seconds,
    }
    seconds = _interleaved(spec, dataset, "one_device", baselines)
    return {
        "stratoflow_examples_per_second": _rate(examples, seconds["stratoflow"]),
        "keras_fit_examples_per_second": _rate(examples, seconds["keras_fit"]),
        "real_input_examples_per_second": _rate(examples, seconds["real_input"]),
        "synthetic_input_examples_per_second": _rate(examples, seconds["synthetic_input"]),
        "training_flops_per_example": training_flops_per_example(spec, dataset),
        "matmul_flops_per_second": _rate(2.0 * MATMUL_SIZE**3, seconds["matmul"]),
        "per_round_ratio_vs_keras_fit": [
            fit / ours
            for ours, fit in zip(seconds["stratoflow"], seconds["keras_fit"], strict=True)
        ],
    }


def _mirrored(spec: Any, dataset: Any) -> dict[str, Any]:
    import tensorflow as tf

    examples = _examples_per_epoch(spec, dataset)
    one_device = tf.distribute.OneDeviceStrategy("/cpu:0")
    baselines = {
        "one_device": _custom_epoch(spec, dataset, one_device, _real_batches(spec, dataset))
    }
    seconds = _interleaved(spec, dataset, "mirrored", baselines)
    return {
        "mirrored_examples_per_second": _rate(examples, seconds["stratoflow"]),
        "one_device_examples_per_second": _rate(examples, seconds["one_device"]),
    }


def _interleaved(
    spec: Any, dataset: Any, strategy: str, baselines: dict[str, Callable[[int], float]]
) -> dict[str, list[float]]:
    """Seconds per measured epoch of stratoflow's run and of each baseline, taken in turns."""
    import dataclasses

    from tasks.training import train

    seconds: dict[str, list[float]] = {name: [] for name in baselines}

    def between_epochs(metrics: Any) -> None:
        for name, run_epoch in baselines.items():
            seconds[name].append(run_epoch(metrics.epoch))

    training = dataclasses.replace(spec.training, strategy=strategy, replicas=2, epochs=ROUNDS + 1)
    with tempfile.TemporaryDirectory() as run_dir:
        result = train(
            dataclasses.replace(spec, training=training),
            dataset,
            Path(run_dir),
            on_epoch_end=between_epochs,
        )
    measured = {name: values[1:] for name, values in seconds.items()}
    measured["stratoflow"] = [epoch["seconds"] for epoch in result.history[1:]]
    return measured


def _examples_per_epoch(spec: Any, dataset: Any) -> int:
    batch = spec.training.batch_size
    return int(dataset.split_sizes["train"] // batch * batch)


def _rate(amount: float, seconds: list[float]) -> float:
    return float(statistics.median(amount / value for value in seconds))


def _real_batches(spec: Any, dataset: Any) -> Callable[[int], Any]:
    """The very input stratoflow trains on (TFDS files, cached, reshuffled each epoch)."""
    from tasks.training import make_epoch_batches

    return make_epoch_batches(dataset, spec.training.batch_size, spec.training.seed)


def _synthetic_batches(spec: Any, dataset: Any) -> Callable[[int], Any]:
    """The same examples as in-memory tensors: no file reading, decoding or shuffling."""
    import tensorflow as tf

    from tasks.datasets import load_arrays

    images, labels = load_arrays(dataset, "train")
    batches = tf.data.Dataset.from_tensor_slices((images, labels)).batch(
        spec.training.batch_size, drop_remainder=True
    )
    return lambda epoch: batches


def _new_model(spec: Any, dataset: Any) -> tuple[Any, Any]:
    import tensorflow as tf

    from tasks.models import build_model

    tf.keras.utils.set_random_seed(spec.training.seed)
    model = build_model(
        spec.model.builder, dataset.image_shape, dataset.num_classes, spec.model.hyperparameters
    )
    optimizer = tf.keras.optimizers.Adam(spec.training.learning_rate)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def _custom_epoch(
    spec: Any, dataset: Any, strategy: Any, batches: Callable[[int], Any]
) -> Callable[[int], float]:
    """One epoch of stratoflow's custom loop (`_CustomLoopEpoch`) on `batches`; returns seconds."""
    from tasks.training import _CustomLoopEpoch  # the very loop stratoflow trains with

    with strategy.scope():
        model, optimizer = _new_model(spec, dataset)
    batch = spec.training.batch_size
    run_epoch = _CustomLoopEpoch(
        strategy, model, optimizer, batch, batches, dataset.split_sizes["train"] // batch
    )

    def timed(epoch: int) -> float:
        start = time.perf_counter()
        run_epoch(epoch, lambda: None)
        return time.perf_counter() - start

    return timed


def _keras_fit_epoch(spec: Any, dataset: Any) -> Callable[[int], float]:
    """The baseline: a plain compiled Keras model and `fit`, nothing of stratoflow's loop."""
    import tensorflow as tf

    model, optimizer = _new_model(spec, dataset)
    model.compile(
        optimizer=optimizer,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    batches = _real_batches(spec, dataset)

    def timed(epoch: int) -> float:
        start = time.perf_counter()
        model.fit(batches(epoch), epochs=1, verbose=0)
        return time.perf_counter() - start

    return timed


def training_flops_per_example(spec: Any, dataset: Any) -> float:
    """Analytic FLOPs of one training example: 3 x the forward pass (forward + 2x backward)."""
    import tensorflow as tf

    from tasks.models import build_model

    model = build_model(
        spec.model.builder, dataset.image_shape, dataset.num_classes, spec.model.hyperparameters
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


def _matmul_seconds(epoch: int) -> float:
    """Seconds per 2048 x 2048 float32 matmul (mean of 10): TensorFlow's peak on this host."""
    import tensorflow as tf

    if not _MATMUL:
        _MATMUL["a"] = tf.random.normal((MATMUL_SIZE, MATMUL_SIZE))
        _MATMUL["b"] = tf.random.normal((MATMUL_SIZE, MATMUL_SIZE))
        _MATMUL["f"] = tf.function(lambda x, y: tf.linalg.matmul(x, y))
        _MATMUL["f"](_MATMUL["a"], _MATMUL["b"]).numpy()  # trace and warm up
    runs = 10
    start = time.perf_counter()
    for _ in range(runs):
        result = _MATMUL["f"](_MATMUL["a"], _MATMUL["b"])
    result.numpy()
    return (time.perf_counter() - start) / runs


if __name__ == "__main__":
    main(sys.argv[1])
