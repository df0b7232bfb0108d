"""Strategy factory: a name from `pipelines.options.STRATEGIES` → a `tf.distribute` strategy.

Device setup must happen before TensorFlow runs its first op, so a training process calls
`configure_host_devices(required_logical_cpus(config))` first and `make_strategy(config)` second.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from pipelines.options import STRATEGIES
from pipelines.spec import TrainingConfig

logger = logging.getLogger(__name__)


class StrategyUnavailableError(RuntimeError):
    """The chosen strategy cannot run on this host (e.g. `tpu` without a TPU)."""


def required_logical_cpus(training: TrainingConfig) -> int:
    """How many logical CPU devices the strategy needs on a CPU-only host."""
    return training.replicas if STRATEGIES[training.strategy].uses_replicas else 1


def configure_host_devices(logical_cpus: int) -> None:
    """On a CPU-only host, split the CPU into `logical_cpus` devices so mirrored has replicas.

    Must run before any TensorFlow op. In a process where TensorFlow already started, it checks
    that enough logical CPUs exist and raises `RuntimeError` otherwise.
    """
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU") or logical_cpus <= 1:
        return
    (cpu,) = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(logical_cpus)]
        )
    except RuntimeError:
        available = len(tf.config.list_logical_devices("CPU"))
        if available < logical_cpus:
            raise RuntimeError(
                f"TensorFlow already started with {available} logical CPU(s); "
                f"{logical_cpus} are needed: configure devices before the first op"
            ) from None


def make_strategy(training: TrainingConfig) -> Any:
    """Create the `tf.distribute.Strategy` named by `training.strategy`.

    Raises:
        ValueError: an unknown strategy name (the message lists the allowed ones).
        StrategyUnavailableError: the strategy needs hardware this host lacks.
    """
    if training.strategy not in _BUILDERS:
        raise ValueError(
            f"strategy {training.strategy!r} is not allowed; allowed: {', '.join(_BUILDERS)}"
        )
    strategy = _BUILDERS[training.strategy](training)
    logger.info(
        "strategy %s: %s with %d replica(s)",
        training.strategy,
        type(strategy).__name__,
        strategy.num_replicas_in_sync,
    )
    return strategy


def _gpus() -> list[Any]:
    import tensorflow as tf

    return tf.config.list_logical_devices("GPU")


def _one_device(training: TrainingConfig) -> Any:
    import tensorflow as tf

    return tf.distribute.OneDeviceStrategy("/gpu:0" if _gpus() else "/cpu:0")


def _auto(training: TrainingConfig) -> Any:
    import tensorflow as tf

    if len(_gpus()) > 1:
        return tf.distribute.MirroredStrategy()
    return _one_device(training)


def _mirrored(training: TrainingConfig) -> Any:
    import tensorflow as tf

    if _gpus():
        return tf.distribute.MirroredStrategy()
    cpus = tf.config.list_logical_devices("CPU")
    if len(cpus) < training.replicas:
        raise StrategyUnavailableError(
            f"mirrored with replicas={training.replicas} needs {training.replicas} logical CPUs; "
            f"this process has {len(cpus)} (call configure_host_devices first)"
        )
    devices = [device.name for device in cpus[: training.replicas]]
    # Several CPU devices in one process: NCCL is not there, reduce through one device.
    return tf.distribute.MirroredStrategy(
        devices=devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
    )


def _tpu(training: TrainingConfig) -> Any:
    import tensorflow as tf

    tpu_address = os.environ.get("TPU_NAME")
    if not tpu_address and not tf.config.list_physical_devices("TPU"):
        fallback = [name for name in STRATEGIES if name != "tpu"]
        raise StrategyUnavailableError(
            "strategy 'tpu' needs a TPU, and this host has none "
            "(tf.config.list_physical_devices('TPU') is empty and TPU_NAME is unset); "
            f"choose one of: {', '.join(fallback)}"
        )
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu_address or "local")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


_BUILDERS = {
    "auto": _auto,
    "one_device": _one_device,
    "mirrored": _mirrored,
    "tpu": _tpu,
}
