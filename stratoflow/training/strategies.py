"""Strategy factory: a name from `stratoflow.config.strategies.STRATEGIES` → a `tf.distribute`
strategy, made by the builder its description names.

Device setup must happen before TensorFlow runs its first op, so a training process calls
`configure_host_devices(required_logical_cpus(config))` first and `make_strategy(config)` second.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from stratoflow.config.strategies import STRATEGIES
from stratoflow.config.training import TrainingConfig

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
    if training.strategy not in STRATEGIES:
        raise ValueError(
            f"strategy {training.strategy!r} is not allowed; allowed: {', '.join(STRATEGIES)}"
        )
    strategy = BUILDERS[STRATEGIES[training.strategy].builder](training)
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


def build_one_device(training: TrainingConfig) -> Any:
    import tensorflow as tf

    return tf.distribute.OneDeviceStrategy("/gpu:0" if _gpus() else "/cpu:0")


def build_auto(training: TrainingConfig) -> Any:
    alias_of = STRATEGIES[training.strategy].alias_of
    assert alias_of is not None, f"{training.strategy} is described without `alias_of`"
    several_gpus, otherwise = alias_of
    picked = STRATEGIES[several_gpus if len(_gpus()) > 1 else otherwise]
    return BUILDERS[picked.builder](training)


def build_mirrored(training: TrainingConfig) -> Any:
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


def build_tpu(training: TrainingConfig) -> Any:
    import tensorflow as tf

    tpu_address = os.environ.get("TPU_NAME")
    if not tpu_address and not tf.config.list_physical_devices("TPU"):
        fallback = [name for name, other in STRATEGIES.items() if not other.needs_tpu]
        raise StrategyUnavailableError(
            "strategy 'tpu' needs a TPU, and this host has none "
            "(tf.config.list_physical_devices('TPU') is empty and TPU_NAME is unset); "
            f"choose one of: {', '.join(fallback)}"
        )
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu_address or "local")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def build_multi_worker_mirrored(training: TrainingConfig) -> Any:
    import tensorflow as tf

    _require_tf_config(training.strategy)
    return tf.distribute.MultiWorkerMirroredStrategy()


def build_parameter_server(training: TrainingConfig) -> Any:
    import tensorflow as tf

    _require_tf_config(training.strategy)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.ParameterServerStrategy(resolver)


def build_central_storage(training: TrainingConfig) -> Any:
    import tensorflow as tf

    if _gpus():
        return tf.distribute.experimental.CentralStorageStrategy()
    cpus = tf.config.list_logical_devices("CPU")
    if len(cpus) < training.replicas:
        raise StrategyUnavailableError(
            f"central_storage with replicas={training.replicas} needs {training.replicas} "
            f"logical CPUs; this process has {len(cpus)}"
        )
    return tf.distribute.experimental.CentralStorageStrategy(
        compute_devices=[device.name for device in cpus[: training.replicas]],
        parameter_device=cpus[0].name,
    )


def _require_tf_config(strategy: str) -> None:
    if not os.environ.get("TF_CONFIG"):
        raise StrategyUnavailableError(
            f"strategy {strategy!r} runs in a cluster process with TF_CONFIG set; the training "
            "task launches one (stratoflow.distributed.cluster), or standing servers provide it"
        )


# The builders by the name a description gives (`Strategy.builder`).
BUILDERS = {
    builder.__name__: builder
    for builder in (
        build_auto,
        build_one_device,
        build_mirrored,
        build_tpu,
        build_multi_worker_mirrored,
        build_parameter_server,
        build_central_storage,
    )
}
