"""Why a pipeline has no DAG: this Airflow DAG file's import error lists every pipeline that did
not load, each with its file and field. It defines no DAG.

The retrain and benchmark DAG files publish every pipeline that loads and keep the failures to
themselves: Airflow marks every DAG of a file with an import error stale, and a stale DAG
cannot be triggered or scheduled. Raising the failures here, in a file with no DAG of its own,
shows them in the UI's "DAG Import Errors" while every other pipeline's DAG runs.
"""

from __future__ import annotations

from dags import benchmark_strategies, retrain


class PipelineError(Exception):
    """One or more pipelines could not become DAGs; the message names each file and field."""


# The same error can come from both files (a spec both load): list it once.
_errors = list(dict.fromkeys([*retrain.PIPELINE_ERRORS, *benchmark_strategies.PIPELINE_ERRORS]))
if _errors:
    raise PipelineError(
        f"{len(_errors)} pipeline(s) could not be loaded:\n"
        + "\n".join(f"- {error}" for error in _errors)
    )
