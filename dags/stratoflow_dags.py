"""stratoflow's Airflow DAGs in this project's own Airflow (`make run`, `make services`, compose).

The file a team puts in its own DAGs folder looks the same, naming its pipelines folder instead of
the examples (docs/how-to/your-airflow.md). Here: the bundled examples, and the pipelines on
`STRATOFLOW_PIPELINES_PATH`.
"""

from stratoflow.dags import publish

publish(globals(), examples=True)
