"""Each strategy described once, as data: everything the rest of stratoflow knows about it.

A description says which processes a run of the strategy needs and in which roles, how the
global batch divides, what the strategy refuses, which loops it runs, where its input is sharded
and whether a coordinator schedules its steps. The TensorFlow side is the builder the description
names, in `stratoflow.training.strategies` (a test checks that every one exists). No other code
compares a strategy's name (a test walks the source for that): it reads these traits.

Adding a strategy is one entry in `STRATEGIES` and its builder; the DAG's Params, the checks of a
run, the launchers and the benchmark pick it up. Light: no TensorFlow (DAG files import it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

# The programs a member runs (`python -m MODULE PAYLOAD RESULT`).
TRAINING_MODULE = "stratoflow.training.worker"
SERVER_MODULE = "stratoflow.distributed.server"

# The run setting a count of members or a batch division comes from.
CountSetting = Literal["workers", "ps"]


@dataclass(frozen=True)
class Role:
    """Members of one TensorFlow job a strategy's run needs.

    Attributes:
        job: the job in TF_CONFIG ("worker", "ps", "chief"); "" for a lone process, no cluster.
        count: how many: a fixed number, or the run setting that says ("workers", "ps").
        module: the program each member runs.
        name: the member's name, formatted with `job` and `index` (logs, MLflow node tags).
        server: a `tf.distribute.Server` that serves until stopped (a standing cluster's own
            servers take its place).
        rejoins: when lost, started again in place while training goes on.
    """

    job: str
    count: int | CountSetting
    module: str
    name: str = "{job} {index}"
    server: bool = False
    rejoins: bool = False


@dataclass(frozen=True)
class Strategy:
    """What the orchestration needs to know about one strategy before TensorFlow starts.

    Attributes:
        name: the strategy's name in a run's settings.
        description: one line for the trigger form's dropdown and the docs.
        builder: the function of `stratoflow.training.strategies` that makes it.
        loops: the training loops it runs ("custom", "fit").
        roles: the processes a run needs, in start order.
        result_from: the member whose result is the run's (the chief).
        uses_replicas: computes on `replicas` devices of one process (logical CPUs on a CPU-only
            host).
        batch_divides_by: the setting the global batch must be divisible by, if any.
        refuses_random_layers: cannot train layers that draw random numbers (Dropout).
        needs_tpu: runs only where a TPU is attached.
        standing_cluster: may train on a standing cluster's servers (the `cluster` setting).
        coordinated: a coordinator schedules the steps on remote workers (asynchronous), instead
            of every replica running each step in lockstep.
        input_sharding: where the training input is split: "strategy" (the strategy distributes
            one dataset over its replicas or workers, `AutoShardPolicy.DATA`) or "per_worker"
            (each worker builds its own input, `create_per_worker_dataset`).
        alias_of: another strategy it picks by the host's devices: (with several GPUs,
            otherwise); benchmarked under that one's name.
    """

    name: str
    description: str
    builder: str
    loops: tuple[str, ...] = ("custom", "fit")
    roles: tuple[Role, ...] = (Role("", 1, TRAINING_MODULE, name="training process"),)
    result_from: str = "training process"
    uses_replicas: bool = False
    batch_divides_by: Literal["replicas", "workers"] | None = None
    refuses_random_layers: bool = False
    needs_tpu: bool = False
    standing_cluster: bool = False
    coordinated: bool = False
    input_sharding: Literal["strategy", "per_worker"] = "strategy"
    alias_of: tuple[str, str] | None = None

    @property
    def uses_workers(self) -> bool:
        """Runs as a cluster of `workers` processes."""
        return any(role.count == "workers" for role in self.roles)

    @property
    def uses_ps(self) -> bool:
        """Has `ps` parameter servers."""
        return any(role.count == "ps" for role in self.roles)


STRATEGIES: dict[str, Strategy] = {
    strategy.name: strategy
    for strategy in (
        Strategy(
            "auto",
            "mirrored over all GPUs if there are several, else one_device",
            "build_auto",
            alias_of=("mirrored", "one_device"),
        ),
        Strategy("one_device", "one device: the first GPU, else the CPU", "build_one_device"),
        Strategy(
            "mirrored",
            "synchronous data parallelism on one host: all GPUs, or `replicas` logical CPUs on "
            "a CPU-only host",
            "build_mirrored",
            uses_replicas=True,
            batch_divides_by="replicas",
        ),
        Strategy(
            "tpu",
            "TPUStrategy; fails clearly where no TPU is attached",
            "build_tpu",
            needs_tpu=True,
        ),
        Strategy(
            "multi_worker_mirrored",
            "synchronous data parallelism across `workers` processes (one per host in production)",
            "build_multi_worker_mirrored",
            loops=("custom",),  # Keras 3 fit fails under MWMS (keras-team/keras#20585)
            # Every worker runs the same training program; worker 0 is the chief.
            roles=(Role("worker", "workers", TRAINING_MODULE),),
            result_from="worker 0",
            batch_divides_by="workers",
        ),
        Strategy(
            "parameter_server",
            "asynchronous training: `workers` workers and `ps` parameter servers, this task "
            "coordinating",
            "build_parameter_server",
            loops=("custom",),  # Keras 3 has no ParameterServerStrategy support in fit
            # Workers and ps are plain `tf.distribute.Server`s; the coordinator trains.
            roles=(
                Role("worker", "workers", SERVER_MODULE, server=True, rejoins=True),
                Role("ps", "ps", SERVER_MODULE, server=True),
                Role("chief", 1, TRAINING_MODULE, name="coordinator"),
            ),
            result_from="coordinator",
            standing_cluster=True,
            coordinated=True,
            input_sharding="per_worker",
        ),
        Strategy(
            "central_storage",
            "variables on the CPU, compute mirrored over `replicas` devices; no random layers",
            "build_central_storage",
            loops=("custom",),  # Keras fit reports a wrong loss under CentralStorage
            uses_replicas=True,
            batch_divides_by="replicas",
            refuses_random_layers=True,
        ),
    )
}


class RunShape(Protocol):
    """The run settings that decide a run's members (a `TrainingConfig` has them)."""

    @property
    def strategy(self) -> str: ...
    @property
    def workers(self) -> int: ...
    @property
    def ps(self) -> int: ...
    @property
    def cluster(self) -> str: ...


@dataclass(frozen=True)
class PlannedMember:
    """One process a run needs, before it has an address: its name, TF job and index, program."""

    name: str
    job: str
    index: int
    module: str
    server: bool = False
    rejoins: bool = False


@dataclass(frozen=True)
class ClusterPlan:
    """The processes a run starts, wherever they are placed, and which one reports the result.

    Attributes:
        members: the members to start, in order.
        result_from: the name of the member whose result is the run's.
        standing_cluster: the deployment's standing cluster whose servers stand in for the
            plan's own ("" none): only the members that are not servers are started.
    """

    members: tuple[PlannedMember, ...]
    result_from: str
    standing_cluster: str = ""


def planned_members(run: RunShape) -> ClusterPlan:
    """The members a run of `run.strategy` needs, from its description and the run's counts.

    A run on a standing cluster (`run.cluster`) starts only the members that are not servers:
    the standing cluster's servers take their place.
    """
    strategy = STRATEGIES[run.strategy]
    counts = {"workers": run.workers, "ps": run.ps}
    standing = run.cluster if strategy.standing_cluster else ""
    members = tuple(
        PlannedMember(
            role.name.format(job=role.job, index=index),
            role.job,
            index,
            role.module,
            role.server,
            role.rejoins,
        )
        for role in strategy.roles
        for index in range(role.count if isinstance(role.count, int) else counts[role.count])
        if not (standing and role.server)
    )
    return ClusterPlan(members, strategy.result_from, standing)


def strategies_with(trait: str) -> list[str]:
    """The names of the strategies whose boolean `trait` is set (for error messages)."""
    return [name for name, strategy in STRATEGIES.items() if getattr(strategy, trait)]
