"""Airflow's metadata DB is changed through Airflow's own API (`stratoflow.services.airflow_runs`).

SQL written by hand against Airflow's tables bypasses what Airflow does when it marks a run
(end dates, durations, teardown tasks, listeners) and breaks silently when its schema changes.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from stratoflow.config import locations

CODE = ("stratoflow", "tasks", "dags")
AIRFLOW_TABLES = r"(dag_run|task_instance|xcom|serialized_dag|dag_version|dag_model|job|dag)"
SQL_ON_AIRFLOW = re.compile(
    rf"\b(SELECT\b.*\bFROM|UPDATE|INSERT\s+INTO|DELETE\s+FROM)\s+{AIRFLOW_TABLES}\b|"
    rf"\bJOIN\s+{AIRFLOW_TABLES}\b",
    re.DOTALL,
)
SQL_DRIVERS = ("sqlite3", "sqlalchemy", "psycopg", "psycopg2")


def _strings(tree: ast.AST) -> list[str]:
    return [
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_module_holds_sql_against_airflows_tables() -> None:
    found = []
    for package in CODE:
        for path in sorted((locations.PROJECT_ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for text in _strings(tree):
                if SQL_ON_AIRFLOW.search(text):
                    found.append(f"{path.relative_to(locations.PROJECT_ROOT)}: {text.strip()[:70]}")
    assert found == []


def test_the_cli_opens_no_database_connection_of_its_own() -> None:
    """The CLI reads and marks DAG runs through `airflow_runs` (Airflow's API in Airflow's
    environment), never with a database driver."""
    cli = locations.PROJECT_ROOT / "stratoflow" / "cli"
    found = {
        str(path.relative_to(locations.PROJECT_ROOT)): sorted(_imports(tree) & set(SQL_DRIVERS))
        for path in sorted(cli.rglob("*.py"))
        if (tree := ast.parse(path.read_text(), str(path)))
    }
    assert {path: drivers for path, drivers in found.items() if drivers} == {}


def test_the_check_sees_sql_written_the_way_the_runner_wrote_it(tmp_path: Path) -> None:
    """The pattern catches SQL split over f-strings, as `stratoflow run` once wrote it."""
    source = (
        "connection.execute(f\"UPDATE task_instance SET state = 'failed', end_date = :now \"\n"
        '    f"WHERE dag_id = :dag_id AND state IN ({running})", key)\n'
        'connection.execute("SELECT run_id, state FROM dag_run WHERE dag_id = ?", (d,))\n'
    )
    matched = sorted(s.split()[0] for s in _strings(ast.parse(source)) if SQL_ON_AIRFLOW.search(s))
    assert matched == ["SELECT", "UPDATE"]
