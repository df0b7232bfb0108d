"""One services stack for every module of this package, started once and stopped once.

The modules run in file order on it: `test_airflow_ui_trigger.py`, `test_approval_in_the_ui.py`,
`test_roles.py`, then `test_services_stack.py`, whose last test stops the stack on purpose
(`down`); nothing may run on the stack after it.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratoflow.config import locations
from stratoflow.config.discovery import PIPELINES_PATH_ENV
from stratoflow.services import Stack, wait_for_dags
from stratoflow.services.airflow_api import AirflowApi
from stratoflow.services.config import ADMIN_USER, MLFLOW_ADMIN_USER
from tests.integration.services.stack import LiveStack

log = logging.getLogger(__name__)
# Pipelines only these tests run (`tests/support/pipelines/`).
TEST_PIPELINES = locations.PROJECT_ROOT / "tests" / "support" / "pipelines"


@pytest.fixture(scope="package")
def live(session_home: Path) -> Iterator[LiveStack]:
    """The whole stack, started once for this package, with this repo's DAGs parsed.

    Its pipelines are the bundled ones and the test pipelines of `TEST_PIPELINES` (those asking
    for approval: `test_approval_in_the_ui.py`), on `STRATOFLOW_PIPELINES_PATH`.
    """
    state = Path(tempfile.mkdtemp(prefix="stratoflow-services-"))
    stack = Stack(state, attached=True, data_dir=locations.data_dir())
    with pytest.MonkeyPatch.context() as env:
        # Before `up`: the stack's processes inherit it, and `up` claims the pipelines' MLflow
        # names for the tasks' account.
        env.setenv(PIPELINES_PATH_ENV, str(TEST_PIPELINES), prepend=os.pathsep)
        try:
            report = stack.up()
            log.info("services: %s", report.describe())
            assert stack.config is not None
            api = AirflowApi(stack.config.api_url, ADMIN_USER, stack.config.admin_password)
            wait_for_dags(stack)
            # The tests' MLflow clients read as the MLflow admin (MLflow's client takes the
            # credentials from the environment); test_roles.py signs in as other users.
            env.setenv("MLFLOW_TRACKING_USERNAME", MLFLOW_ADMIN_USER)
            env.setenv("MLFLOW_TRACKING_PASSWORD", stack.config.mlflow_admin_password)
            yield LiveStack(stack, report, api)
        finally:
            stack.down()
            shutil.rmtree(state, ignore_errors=True)
