"""A real native TensorFlow crash, run as a child by the launcher tests.

Mirrored over two logical CPUs, with a last batch of one example (so one replica gets none),
aborts the process inside MKL's max-pool gradient (`Check failed: dtype() == expected_dtype`,
docs/BENCHMARKS.md, "Facts") on the Intel hosts where TensorFlow takes that oneDNN kernel.
stratoflow avoids it with `drop_remainder=True`; this program triggers it on purpose. Where it
does not crash (seen on AMD EPYC hosts), the program aborts natively itself (libc `abort`, the
same SIGABRT a failed CHECK raises), so the launcher's handling is tested on every host.
"""

from __future__ import annotations

import ctypes
import sys

from stratoflow.training.strategies import configure_host_devices

configure_host_devices(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

strategy = tf.distribute.MirroredStrategy(
    ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice()
)
with strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(4, 3),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    )
    optimizer = keras.optimizers.Adam()
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


def step(images, labels):
    with tf.GradientTape() as tape:
        per_example = loss_fn(labels, model(images, training=True))
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=64)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
    return loss


@tf.function
def train_step(batch):
    return strategy.reduce("SUM", strategy.run(step, args=batch), axis=None)


images = np.random.rand(65, 28, 28, 1).astype("float32")
labels = np.random.randint(0, 10, 65)
batches = tf.data.Dataset.from_tensor_slices((images, labels)).batch(64)  # last batch: 1 example
sys.stdout.write("native crash program: mirrored training with a partial last batch\n")
sys.stdout.flush()
for batch in strategy.experimental_distribute_dataset(batches):
    train_step(batch)
sys.stdout.write("native crash program: TensorFlow survived here; aborting natively\n")
sys.stdout.flush()
ctypes.CDLL(None).abort()
