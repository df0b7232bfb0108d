"""A standing `tf.distribute.Server` (a parameter-server cluster's worker or ps).

Run by the launcher as `python -m stratoflow.distributed.server PAYLOAD RESULT` with TF_CONFIG
naming the
cluster and this task, or by hand / by a deployment as `stratoflow serve --job worker --index 0
--cluster '{"worker": [...], "ps": [...], "chief": [...]}'`. It serves until killed: TensorFlow
servers have no stop, so their owner terminates them (and they die with their parent).
"""

from __future__ import annotations

import json
import logging
import os
import sys

from stratoflow.distributed import lean_tensorflow
from stratoflow.distributed.protocol import READY_MARKER, announce

logger = logging.getLogger(__name__)

# 1 inter-op thread deadlocks ClusterCoordinator.join; 2 is the minimum that works
# (docs/BENCHMARKS.md, "Facts").
INTER_OP_THREADS = 2


def serve(cluster: dict[str, list[str]], job: str, index: int) -> None:
    """Start the server of task `index` of `job` in `cluster` and serve forever."""
    if job not in cluster or not 0 <= index < len(cluster[job]):
        raise ValueError(
            f"task {job}:{index} is not in the cluster; it has "
            + ", ".join(f"{name} x{len(addresses)}" for name, addresses in cluster.items())
        )
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    tf = lean_tensorflow.import_tensorflow()

    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster),
        job_name=job,
        task_index=index,
        protocol="grpc",
        config=tf.compat.v1.ConfigProto(inter_op_parallelism_threads=INTER_OP_THREADS),
        start=True,
    )
    logger.info("serving %s:%d at %s", job, index, server.target)
    announce(READY_MARKER)
    server.join()


def serve_from_tf_config(tf_config: str) -> None:
    """Serve the task TF_CONFIG names (the contract Kubeflow's TFJob and our launcher fulfil)."""
    config = json.loads(tf_config)
    serve(config["cluster"], config["task"]["type"], int(config["task"]["index"]))


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stdout
    )
    serve_from_tf_config(os.environ["TF_CONFIG"])
