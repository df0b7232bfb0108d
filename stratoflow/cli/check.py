"""`stratoflow check`: what a retrain run's first task checks, without Airflow.

For each pipeline, in the order the first task (`stratoflow.tasks.prepare.prepare`) meets them:

1. spec: its `pipeline.yaml` loads and validates, its model is known and its default strategy
   can train it (`run_plan.load_pipeline`, as the DAG files do at parse time);
2. run defaults: a run with no conf, i.e. the DAG Params' defaults, resolves into a valid run
   plan (`stratoflow.config.run_plan.resolve_plan`, as the first task does);
3. dataset: prepared, or prepared now (built offline, or downloaded when the machine can reach
   the files; refused within seconds when it cannot), and its labels fit the task
   (`datasets.prepare_dataset`, as the first task does; the runs reuse what it prepared);
4. own code: the optimizer, the model builder, the preprocessing, the model run on two
   training examples (`validation.check_pipeline_code`, the first task's own check); and a
   note naming each import of stratoflow other than `stratoflow.api` (it works, but only
   `stratoflow.api` is promised to stay).

A check that fails names the pipeline file and the field; the checks after it are skipped.
Everything runs in this process: TensorFlow is imported once, however many pipelines.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stratoflow.config import discovery, names
from stratoflow.config.parsing import SpecError

if TYPE_CHECKING:
    from stratoflow.config.spec import PipelineSpec
    from stratoflow.data.datasets import DatasetRef

CHECKS = ("spec", "run defaults", "dataset", "own code")
OK, FAILED, SKIPPED = "ok", "FAIL", "skip"


class TargetError(ValueError):
    """An argument is neither a pipeline's name nor a folder holding pipelines."""


@dataclass
class PipelineReport:
    """The checks of one pipeline: (status, check, what it found or why it failed)."""

    name: str
    source: str
    results: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(status == OK for status, _, _ in self.results)

    def format(self) -> str:
        lines = [f"pipeline {self.name} ({self.source})"]
        for status, check, text in self.results:
            first, *more = text.splitlines() or [""]
            lines += [f"  {status:<4}  {check}: {first}", *(f"        {line}" for line in more)]
        return "\n".join(lines) + "\n"


def check_command(arguments: Sequence[str]) -> int:
    """Run `stratoflow check ARGUMENTS`, print a report per pipeline and a summary line.

    Args:
        arguments: pipeline names and folders (a pipeline folder, or a folder of them); none:
            every pipeline found (bundled and on `STRATOFLOW_PIPELINES_PATH`).

    Returns:
        0 when every pipeline passed every check, 1 otherwise.

    Raises:
        TargetError: an argument is neither a pipeline's name nor a folder holding pipelines.
    """
    folders = [Path(argument) for argument in arguments if _is_path(argument)]
    reports = []
    with _on_pipelines_path(folders):
        found = discovery.discover()
        for name in _scope(arguments, found):
            if name in found.folders:
                report = check_pipeline(name, found.folders[name] / discovery.PIPELINE_FILE)
            else:
                report = _unloadable(name, found.problems.get(name, "not found"))
            sys.stdout.write(report.format())
            sys.stdout.flush()
            reports.append(report)
    failed = [report.name for report in reports if not report.passed]
    total = f"checked {len(reports)} pipeline{'s' if len(reports) != 1 else ''}"
    if failed:
        sys.stdout.write(
            f"{total}: {len(reports) - len(failed)} passed, {len(failed)} failed: "
            f"{', '.join(failed)}\n"
        )
        return 1
    sys.stdout.write(f"{total}: all passed\n")
    return 0


def check_pipeline(name: str, source: Path | str) -> PipelineReport:
    """Run the checks on pipeline `name` (its spec file `source`), each after the one before.

    Returns:
        The report: one (status, check, text) per check, the checks after a failure skipped.
    """
    report = PipelineReport(name, str(source))
    state: dict[str, Any] = {}
    steps: list[Callable[[], str]] = [
        lambda: _spec(name, state),
        lambda: _run_defaults(name, state),
        lambda: _dataset(state["run"], state),
        lambda: _own_code(state["run"], state["dataset"]),
    ]
    for check, step in zip(CHECKS, steps, strict=True):
        if not report.passed:
            report.results.append((SKIPPED, check, "needs the checks above"))
            continue
        try:
            # What the checks print (TFDS's progress, a pipeline's own print()) is progress:
            # stderr. Stdout keeps the report.
            with contextlib.redirect_stdout(sys.stderr):
                text = step()
            report.results.append((OK, check, text))
        except Exception as error:  # a check reports what failed; it does not stop the others
            report.results.append((FAILED, check, _failure_text(error, report.source)))
    return report


def _spec(name: str, state: dict[str, Any]) -> str:
    from stratoflow.config.run_plan import load_pipeline

    spec = load_pipeline(name)
    state["spec"] = spec
    return f"{spec.task}, model {spec.model.builder}; DAGs {', '.join(dag_ids(spec))}"


def _run_defaults(name: str, state: dict[str, Any]) -> str:
    from stratoflow.config.params import dag_params
    from stratoflow.config.run_plan import resolve_plan

    # A run triggered without a conf gets every Param's default: the first task resolves those.
    defaults = {key: schema["default"] for key, schema in dag_params(state["spec"]).items()}
    run = resolve_plan(name, defaults).spec
    state["run"] = run
    training = run.training
    return (
        f"strategy {training.strategy}, launcher {training.launcher}, epochs "
        f"{training.epochs}, batch size {training.batch_size}, learning rate "
        f"{training.learning_rate}"
    )


def _dataset(spec: PipelineSpec, state: dict[str, Any]) -> str:
    from stratoflow.data.datasets import prepare_dataset

    # The first task's own call: what it refuses, this refuses (see
    # `stratoflow.tasks.prepare.prepare`).
    reference = prepare_dataset(spec.dataset, folder=spec.folder or None, problem_type=spec.task)
    state["dataset"] = reference
    sizes = ", ".join(f"{role} {size}" for role, size in reference.split_sizes.items())
    where = reference.image_folder or reference.data_dir
    return (
        f"{reference.name} {reference.version} {'built now' if reference.built else 'prepared'} "
        f"in {where}: {sizes}; {_describe_features(reference)}"
    )


def _own_code(spec: PipelineSpec, reference: DatasetRef) -> str:
    from stratoflow.config.plugins import API_MODULE, engine_imports
    from stratoflow.training.validation import check_pipeline_code

    check_pipeline_code(spec, reference)
    preprocess = f", preprocessing {spec.dataset.preprocess}" if spec.dataset.preprocess else ""
    text = (
        f"optimizer {spec.optimizer.get('name', 'adam')}, model {spec.model.builder} built and "
        f"run on two training examples{preprocess}"
    )
    internal = engine_imports(spec.folder) if spec.folder else []
    if internal:
        text += (
            f"\nnote: imports stratoflow past {API_MODULE} (works now; only {API_MODULE} is "
            f"kept stable): {'; '.join(internal)}"
        )
    return text


def dag_ids(spec: PipelineSpec) -> list[str]:
    """The DAG ids a pipeline that loads gets (`dags/`): retrain, strategy benchmark
    (classification only) and the refresh DAG of its dataset (shared by its readers)."""
    benchmark = [names.benchmark_dag_id(spec.name)] if spec.task == "classification" else []
    return [
        names.retrain_dag_id(spec.name),
        *benchmark,
        names.refresh_dag_id(spec.dataset.name),
    ]


def _describe_features(reference: DatasetRef) -> str:
    features, target = reference.features, reference.target
    inputs = (
        f"{len(features.columns)} tabular columns"
        if features.kind == "tabular"
        else f"images {'x'.join(map(str, features.shape))}"
    )
    outputs = (
        f"{len(target.class_names)} classes"
        if target.task == "classification"
        else f"{target.num_targets} regression target(s)"
    )
    return f"{inputs} -> {outputs}"


def _failure_text(error: Exception, source: str) -> str:
    from stratoflow.data.datasets import DatasetUnavailableError

    message = str(error).strip()
    if "\n" not in message:
        message = " ".join(message.split())
    # A refusal's message says what is wrong; anything else is named by its type too.
    if not isinstance(error, SpecError | ValueError | DatasetUnavailableError):
        message = f"{type(error).__name__}: {message}"
    # Every refusal names the pipeline file; a message from deeper down gets it here.
    return message if source in message else f"{source}: {message}"


def _unloadable(name: str, problem: str) -> PipelineReport:
    report = PipelineReport(name, "not loaded")
    report.results.append((FAILED, "spec", problem))
    report.results += [(SKIPPED, check, "needs the checks above") for check in CHECKS[1:]]
    return report


def _is_path(argument: str) -> bool:
    return os.sep in argument or argument in (".", "..") or argument.startswith("~")


def _scope(arguments: Sequence[str], found: discovery.Discovery) -> list[str]:
    """The pipeline names the arguments select, in order (every one found when none)."""
    if not arguments:
        return sorted({*found.folders, *found.problems})
    scope: list[str] = []
    for argument in arguments:
        names_here = _names_in_folder(Path(argument)) if _is_path(argument) else None
        if names_here is None and argument in {*found.folders, *found.problems}:
            names_here = [argument]
        if names_here is None and Path(argument).is_dir():
            names_here = _names_in_folder(Path(argument))
        if not names_here:
            raise TargetError(
                f"{argument!r} is neither a pipeline nor a folder holding pipelines (a folder "
                f"with {discovery.PIPELINE_FILE}, or a folder of such folders); pipelines: "
                f"{', '.join(sorted(found.folders))}"
            )
        scope += [name for name in names_here if name not in scope]
    return scope


def _names_in_folder(folder: Path) -> list[str] | None:
    folder = folder.expanduser()
    if not folder.is_dir():
        return None
    if (folder / discovery.PIPELINE_FILE).is_file():
        return [folder.resolve().name]
    return sorted(p.name for p in folder.iterdir() if (p / discovery.PIPELINE_FILE).is_file())


@contextlib.contextmanager
def _on_pipelines_path(folders: Sequence[Path]) -> Iterator[None]:
    """While inside, `folders` are entries of `STRATOFLOW_PIPELINES_PATH` too (a pipeline is
    checked as discovery finds it: a name two folders claim is refused, as in a deployment)."""
    previous = os.environ.get(discovery.PIPELINES_PATH_ENV)
    known = {entry.resolve() for entry in discovery.pipeline_roots()}
    added = [
        str(f.expanduser().resolve()) for f in folders if f.expanduser().resolve() not in known
    ]
    if added:
        entries = [*added, *([previous] if previous else [])]
        os.environ[discovery.PIPELINES_PATH_ENV] = os.pathsep.join(entries)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(discovery.PIPELINES_PATH_ENV, None)
        else:
            os.environ[discovery.PIPELINES_PATH_ENV] = previous
