"""Benchmarks that run inside one fresh TensorFlow process; prints one JSON object.

`python -m benchmarks.in_process single` (one logical CPU device): stratoflow's custom-loop
step vs a bare Keras `fit` on the same tf.data pipeline, real TFDS input vs synthetic in-memory
tensors, the achieved FLOP/s of the training step vs TensorFlow's own matmul FLOP/s.
`python -m benchmarks.in_process mirrored` (two logical CPUs): stratoflow's loop under mirrored.
Each variant runs REPEATS times, interleaved, after a warm-up epoch that absorbs tracing.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPEATS = 3
EPOCHS = 3  # per repeat; the first is warm-up (tracing) and is not counted
MATMUL_SIZE = 2048


def main(mode: str) -> None:
    from tasks.strategies import configure_host_devices

    configure_host_devices(2 if mode == "mirrored" else 1)
    import tensorflow as tf

    from pipelines.spec import load_spec
    from tasks.datasets import prepare_dataset

    spec = load_spec("mnist")
    dataset = prepare_dataset(spec.dataset)
    results: dict[str, Any] = {"mode": mode}
    if mode == "mirrored":
        results["mirrored_examples_per_second"] = _median(
            [_stratoflow_throughput(spec, dataset, "mirrored") for _ in range(REPEATS)]
        )
    else:
        stratoflow, keras_fit, synthetic, real = [], [], [], []
        for _ in range(REPEATS):
            stratoflow.append(_stratoflow_throughput(spec, dataset, "one_device"))
            keras_fit.append(_keras_fit_throughput(spec, dataset))
            real_rate, synthetic_rate = _input_comparison(spec, dataset)
            real.append(real_rate)
            synthetic.append(synthetic_rate)
        results.update(
            stratoflow_examples_per_second=_median(stratoflow),
            keras_fit_examples_per_second=_median(keras_fit),
            real_input_examples_per_second=_median(real),
            synthetic_input_examples_per_second=_median(synthetic),
            training_flops_per_example=training_flops_per_example(spec, dataset),
            matmul_flops_per_second=_median([_matmul_flops(tf) for _ in range(REPEATS)]),
        )
    results["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sys.stdout.write(json.dumps(results) + "\n")


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def _stratoflow_throughput(spec: Any, dataset: Any, strategy: str) -> float:
    import dataclasses

    from tasks.training import train

    training = dataclasses.replace(spec.training, strategy=strategy, replicas=2, epochs=EPOCHS)
    with tempfile.TemporaryDirectory() as run_dir:
        result = train(dataclasses.replace(spec, training=training), dataset, Path(run_dir))
    return _median([epoch["examples_per_second"] for epoch in result.history[1:]])


def _batches(dataset: Any, batch_size: int, seed: int, epoch: int) -> Any:
    import tensorflow as tf

    from tasks.datasets import load_split

    return (
        load_split(dataset, "train")
        .cache()
        .shuffle(dataset.split_sizes["train"], seed=seed + epoch, reshuffle_each_iteration=False)
        .batch(batch_size, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )


def _keras_fit_throughput(spec: Any, dataset: Any) -> float:
    """The baseline: a plain compiled Keras model and `fit`, nothing of stratoflow's loop."""
    import tensorflow as tf

    from tasks.models import build_model

    tf.keras.utils.set_random_seed(spec.training.seed)
    model = build_model(
        spec.model.builder, dataset.image_shape, dataset.num_classes, spec.model.hyperparameters
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(spec.training.learning_rate),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    batch = spec.training.batch_size
    batches = _batches(dataset, batch, spec.training.seed, 1).cache()
    steps = dataset.split_sizes["train"] // batch
    rates = []
    for epoch in range(EPOCHS):
        start = time.perf_counter()
        model.fit(batches, epochs=1, verbose=0)
        if epoch:
            rates.append(steps * batch / (time.perf_counter() - start))
    return _median(rates)


def _input_comparison(spec: Any, dataset: Any) -> tuple[float, float]:
    """The same custom-loop epochs fed by the real TFDS pipeline and by in-memory tensors."""
    import tensorflow as tf

    from tasks.models import build_model
    from tasks.training import _CustomLoopEpoch  # the very loop stratoflow trains with

    batch = spec.training.batch_size
    real_batches = _batches(dataset, batch, spec.training.seed, 1)
    images, labels = next(iter(real_batches.unbatch().batch(dataset.split_sizes["train"])))
    synthetic = tf.data.Dataset.from_tensor_slices((images, labels)).batch(
        batch, drop_remainder=True
    )
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    rates = {}
    for name, source in (
        ("real", lambda epoch: _batches(dataset, batch, spec.training.seed, epoch)),
        ("synthetic", lambda epoch: synthetic),
    ):
        with strategy.scope():
            model = build_model(
                spec.model.builder,
                dataset.image_shape,
                dataset.num_classes,
                spec.model.hyperparameters,
            )
            optimizer = tf.keras.optimizers.Adam(spec.training.learning_rate)
            optimizer.build(model.trainable_variables)
        run_epoch = _CustomLoopEpoch(strategy, model, optimizer, batch, source)
        steps = dataset.split_sizes["train"] // batch
        measured = []
        for epoch in range(EPOCHS):
            start = time.perf_counter()
            run_epoch(epoch, lambda: None)
            if epoch:
                measured.append(steps * batch / (time.perf_counter() - start))
        rates[name] = _median(measured)
    return rates["real"], rates["synthetic"]


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


def _matmul_flops(tf: Any) -> float:
    a = tf.random.normal((MATMUL_SIZE, MATMUL_SIZE))
    b = tf.random.normal((MATMUL_SIZE, MATMUL_SIZE))
    matmul = tf.function(lambda x, y: tf.linalg.matmul(x, y))
    matmul(a, b).numpy()  # trace and warm up
    runs = 10
    start = time.perf_counter()
    for _ in range(runs):
        result = matmul(a, b)
    result.numpy()
    return runs * 2.0 * MATMUL_SIZE**3 / (time.perf_counter() - start)


if __name__ == "__main__":
    main(sys.argv[1])
