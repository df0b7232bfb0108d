"""stratoflow's Airflow DAGs, built from the pipelines found; a DAG file publishes them.

`publish` is the public entry: see `stratoflow.dags.publish` for the two files a DAGs folder holds.
"""

from stratoflow.dags.publish import PipelineError, publish, raise_pipeline_errors

__all__ = ["PipelineError", "publish", "raise_pipeline_errors"]
