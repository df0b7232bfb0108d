"""One services stack for every module of this package, started once and stopped once.

The modules run in file order on it: `test_airflow_ui_trigger.py`, `test_roles.py`, then
`test_services_stack.py`, whose last test stops the stack on purpose (`down`); nothing may run
on the stack after it.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratoflow.config import locations
from stratoflow.services import Stack, wait_for_dags
from stratoflow.services.airflow_api import AirflowApi
from stratoflow.services.config import ADMIN_USER, MLFLOW_ADMIN_USER
from tests.integration.services.stack import LiveStack

log = logging.getLogger(__name__)


@pytest.fixture(scope="package")
def live(session_home: Path) -> Iterator[LiveStack]:
    """The whole stack, started once for this package, with this repo's DAGs parsed."""
    state = Path(tempfile.mkdtemp(prefix="stratoflow-services-"))
    stack = Stack(state, attached=True, data_dir=locations.data_dir())
    try:
        report = stack.up()
        log.info("services: %s", report.describe())
        assert stack.config is not None
        api = AirflowApi(stack.config.api_url, ADMIN_USER, stack.config.admin_password)
        wait_for_dags(stack)
        # The tests' MLflow clients read as the MLflow admin (MLflow's client takes the
        # credentials from the environment); test_roles.py signs in as other users explicitly.
        with pytest.MonkeyPatch.context() as env:
            env.setenv("MLFLOW_TRACKING_USERNAME", MLFLOW_ADMIN_USER)
            env.setenv("MLFLOW_TRACKING_PASSWORD", stack.config.mlflow_admin_password)
            yield LiveStack(stack, report, api)
    finally:
        stack.down()
        shutil.rmtree(state, ignore_errors=True)
