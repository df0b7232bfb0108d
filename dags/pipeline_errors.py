"""Why a pipeline has no Airflow DAG: this DAG file's import error lists every pipeline that did
not load, each with its file and field. It defines no DAG (`stratoflow.dags.publish` says why a
file of its own).
"""

from stratoflow.dags import raise_pipeline_errors

raise_pipeline_errors(examples=True)
