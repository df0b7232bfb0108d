"""What a run trained on: versions, host, devices, cluster and strategy (`environment.json`).

Collected by the training process itself (the chief), after training, so the devices are the ones
TensorFlow actually saw and the replicas the ones the strategy actually had.
"""

from __future__ import annotations

import json
import os
import platform
import socket
from importlib import metadata
from typing import Any

from stratoflow.config import names

# Distribution names whose versions a run records (a missing one is recorded as null).
PACKAGES = (
    "tensorflow-cpu",
    "tensorflow",
    "keras",
    "mlflow",
    "apache-airflow",
    "tensorflow-datasets",
    "numpy",
)


def describe(result: dict[str, Any]) -> dict[str, Any]:
    """The environment of this training process, for the run's `environment.json`.

    Args:
        result: the training result (`stratoflow.distributed.protocol.TrainingResult` as a dict):
        strategy,
            loop, replicas, workers and global batch size as they ran.

    Returns:
        JSON-able: `strategy`, `loop`, `num_replicas`, `num_workers`, `global_batch_size`,
        `versions` (Python and the packages above), `host` (name, platform, CPU count, CPUs this
        process may use, its intra-op threads and nice level, memory), `devices` (physical and
        logical, as TensorFlow lists them) and
        `cluster` (workers, ps, the TF_CONFIG jobs with their addresses and this process's
        task, and the node of every member when a launcher placed them on several nodes;
        no jobs for a single-process strategy).
    """
    import psutil
    import tensorflow as tf

    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    jobs = tf_config.get("cluster", {})
    return {
        "strategy": result["strategy"],
        "loop": result["loop"],
        "num_replicas": result["num_replicas"],
        "num_workers": result["num_workers"],
        "global_batch_size": result["global_batch_size"],
        "versions": {
            "python": platform.python_version(),
            "tensorflow (runtime)": tf.__version__,
            **{name: _version(name) for name in PACKAGES},
        },
        "host": {
            "hostname": socket.gethostname(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "cpus_available": len(os.sched_getaffinity(0)),
            "intra_op_threads": intra_op_threads(),
            "nice": os.getpriority(os.PRIO_PROCESS, 0),
            "memory_mb": round(psutil.virtual_memory().total / 2**20),
        },
        "devices": {
            "physical": [device.name for device in tf.config.list_physical_devices()],
            "logical": [device.name for device in tf.config.list_logical_devices()],
        },
        "cluster": {
            "jobs": jobs,
            "workers": result["num_workers"],
            "ps": len(jobs.get("ps", [])),
            "task": tf_config.get("task"),
            # member name -> its node, when a launcher placed the members on several nodes
            "nodes": json.loads(os.environ.get(names.NODES_ENV) or "{}"),
        },
    }


def intra_op_threads() -> int:
    """How many threads TensorFlow runs one op's work on in this process: as configured
    (`tf.config.threading`), else `$TF_NUM_INTRAOP_THREADS` (a launcher's share of the host),
    else TensorFlow's default, one per CPU this process may use."""
    import tensorflow as tf

    configured = tf.config.threading.get_intra_op_parallelism_threads()
    from_environment = os.environ.get("TF_NUM_INTRAOP_THREADS", "")
    if configured:
        return int(configured)
    if from_environment.isdigit() and int(from_environment) > 0:
        return int(from_environment)
    return len(os.sched_getaffinity(0))


def tensorflow_distribution() -> str:
    """The distribution that installed TensorFlow here: `tensorflow-cpu` (the base install) or
    `tensorflow` (the `gpu` extra), which a served model's requirements must name."""
    return "tensorflow-cpu" if _version("tensorflow-cpu") else "tensorflow"


def training_distributions() -> dict[str, str]:
    """The TensorFlow build and the Keras installed here, with their versions: what a model this
    process trained needs to be served (`{"tensorflow-cpu": "2.21.0", "keras": "3.15.0"}`)."""
    found = {name: _version(name) for name in (tensorflow_distribution(), "keras")}
    return {name: version for name, version in found.items() if version}


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
