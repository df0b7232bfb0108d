"""What passes between a launcher and the processes it starts, and what a launcher promises.

A member is `python -m MODULE PAYLOAD RESULT`: it reads its input from the file PAYLOAD (for a
training process, a `TrainingPayload`, serialised once by the task), prints `READY_MARKER` once
it is up and `FIRST_STEP_MARKER` after its first step, and writes its result to the file RESULT
(a `TrainingResult`) or `{"error": ...}` (`child_main`). A `Launcher` (local processes, or Ray
actors) runs a run's planned members under that contract and returns the typed result.

Small and light on purpose: the training process and the servers import this, not the
supervisor (`stratoflow.distributed.launcher`).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from stratoflow.config.run_plan import RunPlan
from stratoflow.config.strategies import ClusterPlan

logger = logging.getLogger(__name__)

# A member prints this line once it is up (imports done, strategy or server created).
READY_MARKER = "STRATOFLOW-READY"
# The result member prints this line when its first training step is done.
FIRST_STEP_MARKER = "STRATOFLOW-FIRST-STEP"
# When the cluster was started (time.time()), in every member's environment:
# `seconds_to_first_step` counts from it.
PROCESS_START_ENV = "STRATOFLOW_PROCESS_START"


# A member's report to the task that runs it, on a line of its own: this prefix, then one JSON
# object {"kind": ..., "data": {...}}. The chief reports each epoch's metrics (`EPOCH_REPORT`) and
# samples of its host (`SYSTEM_REPORT`); the task logs them into MLflow, so no process that runs
# pipeline code holds MLflow's client or its service account.
REPORT_PREFIX = "STRATOFLOW-REPORT "
EPOCH_REPORT = "epoch"
SYSTEM_REPORT = "system"
REPORT_KINDS = (EPOCH_REPORT, SYSTEM_REPORT)
# What the task does with a member's report: `(kind, data)`.
ReportSink = Callable[[str, dict[str, Any]], None]


def announce(marker: str) -> None:
    """Print `marker` on a line of its own at once (the launcher reads the member's output)."""
    # One write of the whole line: the chief's sampling thread reports beside its main thread.
    sys.stdout.write(marker + "\n")
    sys.stdout.flush()


def report(kind: str, data: dict[str, Any]) -> None:
    """Report `data` (JSON types) to the task, as a line its launcher reads (`read_report`)."""
    announce(REPORT_PREFIX + json.dumps({"kind": kind, "data": data}))


def read_report(line: str) -> tuple[str, dict[str, Any]] | None:
    """The `(kind, data)` of a member's report line; None for any other line (or a report line
    that is cut or of an unknown kind: it is then logged as output, not taken)."""
    if not line.startswith(REPORT_PREFIX):
        return None
    try:
        message = json.loads(line[len(REPORT_PREFIX) :])
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("kind") not in REPORT_KINDS:
        return None
    data = message.get("data")
    return (message["kind"], data) if isinstance(data, dict) else None


def child_main(main: Callable[[str, str], None], what: str) -> None:
    """The entry of a child program, `python -m module PAYLOAD RESULT`: `main(PAYLOAD, RESULT)`.

    A Python error is logged (`what` failed) and handed to the launcher in the result file
    (`{"error": "Type: message"}`, exit status 2), which raises it in the task.
    """
    try:
        main(*sys.argv[1:3])
    except Exception as error:
        logging.getLogger(main.__module__).exception("%s failed", what)
        Path(sys.argv[2]).write_text(json.dumps({"error": f"{type(error).__name__}: {error}"}))
        sys.exit(2)


@dataclass(frozen=True)
class TrainingPayload:
    """The input of every process of a training run (`stratoflow.training.worker`).

    It carries the run's plan as itself: a member reads it back with `RunPlan.from_dict`, which
    checks that it is one and validates nothing again (no YAML read, no setting re-checked).
    Nothing of MLflow: the chief reports epochs and host samples to the task (`report`).

    Attributes:
        plan: the run's plan (`stratoflow.config.run_plan`).
        dataset: the prepared dataset's reference (`DatasetRef.to_dict`).
        run_dir: the run's folder (checkpoints, history, model).
        system_metrics_seconds: how often the chief samples its host (`SYSTEM_REPORT`).
    """

    plan: RunPlan
    dataset: dict[str, Any]
    run_dir: str
    system_metrics_seconds: float

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "plan": self.plan.to_dict()})

    @classmethod
    def from_json(cls, text: str) -> TrainingPayload:
        """The payload `to_json` wrote.

        Raises:
            PlanError: its plan is not one (the field named).
        """
        data = json.loads(text)
        return cls(**{**data, "plan": RunPlan.from_dict(data["plan"], "the training payload")})


@dataclass(frozen=True)
class TrainingResult:
    """What a training run produced: the result member's summary, and where the members ran.

    Attributes:
        model_path: the saved Keras model.
        strategy: the strategy trained under.
        loop: the training loop ("custom" or "fit").
        num_replicas: replicas the strategy trained on.
        num_workers: worker processes it trained in.
        global_batch_size: the batch over all replicas.
        epochs: epochs trained in all (this try and the ones it resumed from).
        resumed_from_epoch: the last epoch an earlier try had saved (0: none).
        history: each epoch's metrics (`stratoflow.training.trainer.EpochMetrics.to_dict`).
        seconds_to_first_step: from the cluster's start to the first step done (None: no step).
        train_seconds: the epochs' wall time in this try.
        peak_rss_mb: the result member's peak resident memory.
        step_losses: the loss of each of the first steps, when a diagnostic asked for them.
        nodes: member name -> where it ran (filled by the launcher).
        environment: the result member's versions, devices and host
            (`stratoflow.tracking.environment.describe`; empty from an older member).
        test_outputs_path: what the chief recorded of the saved model on the test split
            (`stratoflow.training.recorded_outputs`; empty from an older member).
    """

    model_path: str
    strategy: str
    loop: str
    num_replicas: int
    num_workers: int
    global_batch_size: int
    epochs: int
    resumed_from_epoch: int
    history: list[dict[str, float]] = field(default_factory=list)
    seconds_to_first_step: float | None = None
    train_seconds: float = 0.0
    peak_rss_mb: float = 0.0
    step_losses: list[float] = field(default_factory=list)
    nodes: dict[str, str] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    test_outputs_path: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainingResult:
        return cls(**data)


@dataclass
class Restart:
    """One recovery: which member was lost, why, and when training went on again."""

    number: int
    member: str
    reason: str
    in_place: bool
    failed_at: float  # time.time()
    training_again_at: float | None = None

    @property
    def seconds_to_recover(self) -> float | None:
        """Seconds from the loss to training again (the rejoined worker up, or the restarted
        cluster's first step); None if that never came."""
        if self.training_again_at is None:
            return None
        return self.training_again_at - self.failed_at


class Restarts:
    """A run's restart budget (`max_restarts`) and the restarts it spent, across clusters."""

    def __init__(self, limit: int):
        self.limit = limit
        self.events: list[Restart] = []

    def allowed(self) -> bool:
        return len(self.events) < self.limit

    def record(self, member: str, reason: str, in_place: bool) -> Restart:
        event = Restart(len(self.events) + 1, member, reason, in_place, time.time())
        self.events.append(event)
        logger.warning(
            "restart %d/%d: %s was lost (%s); %s",
            event.number,
            self.limit,
            member,
            reason,
            "starting it again in place, training goes on"
            if in_place
            else "restarting the cluster from its last checkpoint",
        )
        return event

    def training_again(self, in_place: bool, member: str | None = None) -> None:
        """Note the time training went on after the open restarts (of `member`, if given)."""
        for event in self.events:
            if event.training_again_at is not None or event.in_place != in_place:
                continue
            if member is None or event.member == member:
                event.training_again_at = time.time()
                logger.info(
                    "training again %.1f s after %s was lost",
                    event.seconds_to_recover,
                    event.member,
                )


@runtime_checkable
class Launcher(Protocol):
    """Runs a training run's members somewhere and supervises them until the result is in.

    The two implementations: `stratoflow.distributed.launcher.LocalLauncher` (child processes
    of this task) and `stratoflow.distributed.ray_launcher.RayLauncher` (actors on a Ray cluster);
    `stratoflow.distributed.launchers.launcher_for` picks one by the run's `launcher` setting.
    """

    def run(
        self,
        plan: ClusterPlan,
        payload: TrainingPayload,
        restarts: Restarts,
        reports: ReportSink | None = None,
    ) -> TrainingResult:
        """Run `plan`'s members on `payload` until its result member is done; its result.

        A lost member is recovered while `restarts` allows (each restart is recorded there).
        Each report a member prints (`report`) goes to `reports` as it arrives, and every one
        printed before the result member finished has been handed over when this returns.

        Raises:
            ChildProcessFailed: a member failed, or was lost more often than `restarts` allows.
        """
        ...
