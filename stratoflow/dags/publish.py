"""Publish stratoflow's DAGs into an Airflow: the call a file in a team's DAGs folder makes.

    # stratoflow_dags.py, in the DAGs folder: Airflow parses it for stratoflow's DAGs.
    from stratoflow.dags import publish

    publish(globals(), pipelines="/opt/airflow/ml_pipelines")

That file gets, for each pipeline found in the folders it names, the DAGs `retrain_<pipeline>` and
(classification pipelines) `benchmark_strategies_<pipeline>`, and one `refresh_<dataset>` per
dataset they read. The bundled examples join only with `examples=True`.

A pipeline that does not load is left out, alone: Airflow marks every DAG of a file that raises
stale, and a stale DAG can be neither triggered nor scheduled, so one broken pipeline would take
all the others down. A second file shows the failures as its import error, in the UI's "DAG Import
Errors", and defines no DAG:

    # stratoflow_pipeline_errors.py: why a pipeline has no Airflow DAG.
    from stratoflow.dags import raise_pipeline_errors

    raise_pipeline_errors(pipelines="/opt/airflow/ml_pipelines")

Airflow's DAG processor reads a file only if it contains the words "airflow" and "dag" (its safe
mode): the comments above are there for it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, MutableMapping
from typing import Any

from airflow.sdk import DAG, get_parsing_context

from stratoflow.config import names
from stratoflow.config.assets import datasets_in_use
from stratoflow.config.discovery import discover, use_pipelines
from stratoflow.config.run_plan import load_pipeline
from stratoflow.dags import benchmark_strategies, refresh_datasets, retrain

Folders = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]


class PipelineError(Exception):
    """One or more pipelines could not become DAGs; the message names each file and field."""


def publish(
    namespace: MutableMapping[str, Any],
    pipelines: Folders = (),
    *,
    only: Iterable[str] | None = None,
    examples: bool = False,
) -> list[str]:
    """Put the DAGs of the pipelines found into a DAG file's globals, where Airflow looks.

    Args:
        namespace: the calling DAG file's `globals()`.
        pipelines: a folder of pipeline folders (or one pipeline folder), or several; they join
            the entries of `$STRATOFLOW_PIPELINES_PATH`, which stay.
        only: the names of the pipelines to publish; all that are found when None. A name not
            found is reported as an error.
        examples: also find the bundled example pipelines (mnist, digits, penguins, diabetes).

    Returns:
        Why each pipeline that did not load has no DAG, naming its file and field
        (`raise_pipeline_errors` raises them from a file of its own).
    """
    dags, errors = build_dags(pipelines, only=only, examples=examples, one_dag_if_asked=True)
    for dag in dags:
        namespace[dag.dag_id] = dag
    return errors


def raise_pipeline_errors(
    pipelines: Folders = (), *, only: Iterable[str] | None = None, examples: bool = False
) -> None:
    """Raise `PipelineError` listing every pipeline `publish` (same arguments) leaves out.

    Call it from a DAG file of its own, which then defines no DAG.

    Raises:
        PipelineError: one or more pipelines did not load; one line each, with its file and field.
    """
    _, errors = build_dags(pipelines, only=only, examples=examples)
    if errors:
        raise PipelineError(
            f"{len(errors)} pipeline(s) could not be loaded:\n"
            + "\n".join(f"- {error}" for error in errors)
        )


def build_dags(
    pipelines: Folders = (),
    *,
    only: Iterable[str] | None = None,
    examples: bool = False,
    one_dag_if_asked: bool = False,
) -> tuple[list[DAG], list[str]]:
    """The DAGs of the pipelines that load, and why each of the others did not (see `publish`).

    `one_dag_if_asked`: build only the DAG Airflow's parsing context names, when it names one of
    these pipelines' (`_the_one_dag_needed`); the errors are then those of that pipeline (and of
    discovery). `raise_pipeline_errors` leaves it off: its import error always lists every
    pipeline that does not load, whichever parse records it.
    """
    use_pipelines(_folders(pipelines), examples=examples)
    discovered = discover()  # once: each folder is looked at a single time per parse
    found, problems = sorted(discovered.folders), discovered.problems
    wanted = found if only is None else list(dict.fromkeys(only))
    # Every problem when all are published (a path entry's too); else those of the names asked.
    errors = [
        problem for name, problem in sorted(problems.items()) if only is None or name in wanted
    ]
    errors += [
        f"pipeline {name!r} is not among the pipelines found ({', '.join(found) or 'none'})"
        for name in wanted
        if name not in found and name not in problems
    ]
    builders = {
        name: {
            names.retrain_dag_id(name): retrain.build_dag,
            names.benchmark_dag_id(name): benchmark_strategies.benchmark_dag,
        }
        for name in wanted
        if name in found
    }
    only_dag = _the_one_dag_needed(builders) if one_dag_if_asked else None
    dags: list[DAG] = []
    datasets: set[str] = set()
    for name, pipeline_builders in builders.items():
        if only_dag is not None and only_dag not in pipeline_builders:
            continue
        try:  # one pipeline's mistake must not hide the others
            spec = load_pipeline(name)
            pipeline_dags = [
                build(spec)
                for dag_id, build in pipeline_builders.items()
                if only_dag in (None, dag_id)
            ]
        except Exception as error:
            errors.append(f"pipeline {name!r}: {error}")
            continue
        dags += [dag for dag in pipeline_dags if dag is not None]
        datasets.add(spec.dataset.name)
    if only_dag is None:
        dags += [refresh_datasets.build_dag(name) for name in datasets_in_use() if name in datasets]
    return dags, errors


def _the_one_dag_needed(builders: dict[str, dict[str, Any]]) -> str | None:
    """The id of the only DAG this parse needs, if Airflow says so and it is a pipeline's.

    Airflow names the DAG in its parsing context when it parses a file for one DAG: a task's
    process before it runs the task, `airflow dags test` and `tasks test`. Building that DAG
    alone (Airflow's documented optimisation for files that make many DAGs) spares the others'
    specs and Params, and `dags test` their serialisation: with the four bundled pipelines, 0.07
    s to parse instead of 0.14 s, and 0.07 s to serialise instead of 0.29 s, twice per `dags
    test`. A refresh DAG needs every spec (its description names the pipelines reading the
    dataset), so with its id, or one not found here, everything is built as usual.
    """
    asked = get_parsing_context().dag_id
    if any(asked in pipeline_builders for pipeline_builders in builders.values()):
        return asked
    return None


def _folders(pipelines: Folders) -> list[str | os.PathLike[str]]:
    if isinstance(pipelines, str | os.PathLike):
        return [pipelines]
    return list(pipelines)
