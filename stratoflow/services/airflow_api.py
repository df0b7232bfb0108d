"""A small client of Airflow's REST API v2 with token auth: what a user or a script does over HTTP.

    api = AirflowApi("http://127.0.0.1:8080", "admin", password)
    run = api.trigger("retrain_mnist", {"strategy": "mirrored", "replicas": 2, "epochs": 2})
    api.wait_for_run("retrain_mnist", run["dag_run_id"], timeout_seconds=600)

The token comes from `POST /auth/token`; every other call sends it as a bearer token.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from typing import Any

FINISHED_STATES = ("success", "failed")
# Tries of a repeatable call that Airflow answered with HTTP 500 "Database error" (`request`).
DATABASE_ERROR_ATTEMPTS = 3


class AirflowApiError(RuntimeError):
    """An API call failed; the message has the method, path, status and Airflow's answer."""

    def __init__(self, message: str, status_code: int):
        super().__init__(message)
        self.status_code = status_code

    def is_database_error(self) -> bool:
        """Airflow's answer to a failed transaction (e.g. a deadlock): worth another try."""
        return self.status_code == 500 and "Database error" in str(self)


class AirflowApi:
    """Airflow REST API v2 calls, authenticated with a JWT from `POST /auth/token`.

    Args:
        base_url: the API server, e.g. `http://127.0.0.1:8080`.
        username: a user of the auth manager.
        password: that user's password.
        timeout_seconds: per request.
    """

    def __init__(self, base_url: str, username: str, password: str, timeout_seconds: float = 30):
        import httpx

        self.base_url = base_url.rstrip("/")
        self._credentials = {"username": username, "password": password}
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_seconds)
        self._token: str | None = None

    def token(self) -> str:
        """A fresh access token (`POST /auth/token`)."""
        response = self._http.post("/auth/token", json=self._credentials)
        if response.status_code not in (200, 201):
            raise AirflowApiError(
                f"POST /auth/token: HTTP {response.status_code}: {response.text[:500]}",
                response.status_code,
            )
        self._token = str(response.json()["access_token"])
        return self._token

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Call `path` (under the base URL) with the token; the JSON answer, or raise.

        A call that may be repeated (any method but POST) is tried again after an HTTP 500
        "Database error", up to `DATABASE_ERROR_ATTEMPTS` times: the scheduler may be writing
        the same rows at that moment, and on PostgreSQL one of the two transactions then fails
        (a deadlock). Airflow's scheduler retries its own side the same way.

        Raises:
            AirflowApiError: a status other than 2xx.
        """
        attempts = 1 if method.upper() == "POST" else DATABASE_ERROR_ATTEMPTS
        for attempt in range(1, attempts + 1):
            try:
                return self._request_once(method, path, **kwargs)
            except AirflowApiError as error:
                if not error.is_database_error() or attempt == attempts:
                    raise
                time.sleep(attempt)

    def _request_once(self, method: str, path: str, **kwargs: Any) -> Any:
        if self._token is None:
            self.token()
        headers = {"Authorization": f"Bearer {self._token}", **kwargs.pop("headers", {})}
        response = self._http.request(method, path, headers=headers, **kwargs)
        if response.status_code == 401:  # expired: one new token, one more try
            headers["Authorization"] = f"Bearer {self.token()}"
            response = self._http.request(method, path, headers=headers, **kwargs)
        if response.status_code >= 300:
            raise AirflowApiError(
                f"{method} {path}: HTTP {response.status_code}: {response.text[:2000]}",
                response.status_code,
            )
        return response.json() if response.content else None

    # ----- DAGs and runs ---------------------------------------------------------------------

    def dag(self, dag_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/api/v2/dags/{dag_id}"))

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self.request("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": paused})

    def trigger(self, dag_id: str, conf: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Create a DAG run now with `conf` (Airflow validates it against the DAG's Params)."""
        body = {"logical_date": None, "conf": dict(conf or {})}
        return dict(self.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", json=body))

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        """The DAG's runs, oldest first."""
        answer = self.request(
            "GET", f"/api/v2/dags/{dag_id}/dagRuns", params={"order_by": "id", "limit": 100}
        )
        return list(answer["dag_runs"])

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}"))

    def set_run_state(self, dag_id: str, run_id: str, state: str) -> None:
        self.request("PATCH", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}", json={"state": state})

    def delete_run(self, dag_id: str, run_id: str) -> None:
        self.request("DELETE", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")

    def wait_for_run(
        self,
        dag_id: str,
        run_id: str,
        timeout_seconds: float,
        states: Collection[str] = FINISHED_STATES,
    ) -> dict[str, Any]:
        """Poll the run until its state is one of `states`; its last description.

        Raises:
            TimeoutError: not in `states` after `timeout_seconds`; the message has the task states.
        """
        deadline = time.monotonic() + timeout_seconds
        while True:
            run = self.run(dag_id, run_id)
            if run["state"] in states:
                return run
            if time.monotonic() > deadline:
                tasks = {t["task_id"]: t["state"] for t in self.task_instances(dag_id, run_id)}
                raise TimeoutError(
                    f"{dag_id} run {run_id} is {run['state']} after {timeout_seconds:.0f} s, "
                    f"not {'/'.join(states)}; tasks: {tasks}"
                )
            time.sleep(2)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        answer = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        return list(answer["task_instances"])

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict[str, Any]:
        return dict(
            self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")
        )

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        """The whole log of one try of a task, as text (one line per log event)."""
        answer = self.request(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            params={"full_content": "true"},
            headers={"Accept": "application/json"},
        )
        content = answer.get("content", [])
        if isinstance(content, str):
            return content
        return "\n".join(_log_line(event) for event in content)

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        """A task's XCom value (its return value by default), deserialized."""
        answer = self.request(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}",
            params={"deserialize": "true", "stringify": "false"},
        )
        return answer["value"]

    # ----- assets ----------------------------------------------------------------------------

    def asset(self, uri: str) -> dict[str, Any]:
        """The asset whose URI is exactly `uri`.

        Raises:
            LookupError: Airflow knows no such asset (its DAGs may not be parsed yet).
        """
        answer = self.request("GET", "/api/v2/assets", params={"uri_pattern": uri})
        matches = [a for a in answer["assets"] if a["uri"] == uri]
        if not matches:
            raise LookupError(f"no asset with URI {uri!r}")
        return dict(matches[0])

    def create_asset_event(self, asset_id: int, extra: Mapping[str, Any]) -> dict[str, Any]:
        """Record an event of the asset (`POST /api/v2/assets/events`): its consumers run."""
        body = {"asset_id": asset_id, "extra": dict(extra)}
        return dict(self.request("POST", "/api/v2/assets/events", json=body))

    def close(self) -> None:
        self._http.close()


def _log_line(event: Any) -> str:
    if not isinstance(event, dict):
        return str(event)
    text = str(event.get("event", ""))
    extras = {k: v for k, v in event.items() if k not in ("event", "timestamp", "level", "logger")}
    suffix = " ".join(f"{k}={v}" for k, v in extras.items())
    return f"{event.get('timestamp', '')} {event.get('level', '')} {text} {suffix}".strip()
