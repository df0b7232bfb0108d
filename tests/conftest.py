"""Session-wide test setup: an isolated state folder, stores and Airflow home for the whole run.

Everything a test writes goes under one temporary STRATOFLOW_HOME. The TFDS data dir is shared by
the session so each bundled dataset is built once. The pytest process splits its CPU into two
logical devices before TensorFlow runs any op, so `mirrored` tests get two replicas in-process.

Where a test lives: one module's in tests/unit/<package path>/test_<module>.py whatever it starts
(the `integration` marker, not the folder, says so); several parts together in tests/integration/.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

_SESSION_HOME = Path(tempfile.mkdtemp(prefix="stratoflow-tests-"))

# Set before any project, TensorFlow, MLflow or Airflow import reads them.
os.environ.update(
    {
        "STRATOFLOW_HOME": str(_SESSION_HOME),
        "MLFLOW_TRACKING_URI": f"sqlite:///{_SESSION_HOME / 'mlflow.db'}",
        "TFDS_DATA_DIR": str(_SESSION_HOME / "tensorflow_datasets"),
        "AIRFLOW_HOME": str(_SESSION_HOME / "airflow"),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "GIT_PYTHON_REFRESH": "quiet",
    }
)

TEST_LOGICAL_CPUS = 2


@pytest.fixture(scope="session")
def session_home() -> Path:
    return _SESSION_HOME


# The only skips the suite accepts, by test and reason. Any other skip hides a missing tool or an
# unchecked promise, so it is reported as a failure (CI runs this same suite: `.ci/run`).
ALLOWED_SKIPS = {
    # No Docker engine or compose plugin on the test hosts (not installable from PyPI or apt).
    "tests/deploy/test_compose.py::test_docker_compose_config_accepts_the_file": (
        "the docker compose plugin is not installed"
    ),
}


# `make test` runs the suite on two pytest-xdist workers. A file's tests share module fixtures and
# the services package's three files share one stack, so each is one unit of work that a single
# worker runs in file order (the scheduler below). Units start slowest first (figures from CI),
# so that no long unit starts last while the other worker idles; the rest keep collection order.
# Not `--dist loadgroup`: xdist 3.8 names a test's group by rewriting `item._nodeid`, which
# pytest 9 no longer reads, so every test became a unit of its own.
SERVICES_PACKAGE = "tests/integration/services"
SLOWEST_UNITS_FIRST = (
    SERVICES_PACKAGE,  # about 12 minutes
    "tests/unit/stratoflow/distributed/test_launcher_multiprocess.py",
    "tests/integration/test_ray_hosts.py",
    "tests/integration/test_retrain_dag.py",
    "tests/integration/test_cluster_strategies_dag.py",
    "tests/integration/test_own_pipelines.py",
    "tests/integration/test_data_gate_dag.py",
    "tests/integration/test_stopping_a_run.py",
    "tests/integration/test_unattended_runs.py",  # about 3 minutes
    "tests/unit/stratoflow/training/test_strategies_equivalence.py",
    "tests/integration/test_benchmark_dag.py",
    "tests/integration/test_standing_cluster.py",
    "tests/unit/stratoflow/test_tasks.py",
)


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or the services package."""
    path = nodeid.split("::")[0]
    return SERVICES_PACKAGE if path.startswith(f"{SERVICES_PACKAGE}/") else path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {unit: position for position, unit in enumerate(SLOWEST_UNITS_FIRST)}
    items.sort(key=lambda item: rank.get(work_unit(item.nodeid), len(rank)))  # stable


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Whole work units to each worker, in collection order (run with --no-loadscope-reorder)."""
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WorkUnitScheduling(config, log)


# What the `integration` marker is for (pyproject.toml): a test without it starts no training
# process, no Airflow command and no server, so `pytest -m "not integration"` stays fast.
_SERVER_PROGRAMS = {"postgres", "pg_ctl", "initdb"}
_STARTED_UNMARKED = pytest.StashKey[list[str]]()


def integration_only(args: Any, env: Mapping[str, str] | None = None) -> str | None:
    """What makes a command line integration-only (see above), or None when nothing does."""
    if isinstance(args, (str, bytes, os.PathLike)):
        args = [args]
    argv = [os.fsdecode(arg) for arg in args]
    if not argv:
        return None
    program = Path(argv[0]).name
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    if (env or {}).get("TF_CONFIG") or module.startswith(
        ("stratoflow.training.", "stratoflow.distributed.")
    ):
        return "a training process"
    if "airflow" in (program, module):
        return "an Airflow command"
    if program in _SERVER_PROGRAMS or ("mlflow" in (program, module) and "server" in argv):
        return "a server"
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Fail a test not marked `integration` that starts what only integration tests may."""
    if item.get_closest_marker("integration"):
        yield
        return
    started = item.stash.setdefault(_STARTED_UNMARKED, [])
    original = subprocess.Popen.__init__

    def checked(self: Any, args: Any, *more: Any, **kwargs: Any) -> None:
        what = integration_only(args, kwargs.get("env"))
        if what:
            started.append(f"{what}: {args}")  # also when started in another thread
            self._child_created = False  # what Popen.__del__ reads
            pytest.fail(f"{item.nodeid} starts {what} but is not marked integration: {args}")
        original(self, args, *more, **kwargs)

    subprocess.Popen.__init__ = checked  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = original  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Turn a skip that is not in ALLOWED_SKIPS into a failure naming the skip's reason, and a
    passed test that started an integration-only process (in any thread) into a failure."""
    outcome = yield
    report = outcome.get_result()
    started = item.stash.get(_STARTED_UNMARKED, [])
    if started and report.passed and report.when == "call":
        report.outcome = "failed"
        report.longrepr = f"started without the integration marker: {'; '.join(started)}"
        return
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    reason = reason.removeprefix("Skipped: ")
    allowed = ALLOWED_SKIPS.get(item.nodeid.split("[")[0])
    if allowed is not None and reason.startswith(allowed):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"unexpected skip ({reason}): only the skips in tests/conftest.py ALLOWED_SKIPS are "
        "allowed; install what is missing or make the test run"
    )


@pytest.fixture(scope="session")
def tf_runtime():
    """TensorFlow in the pytest process, with two logical CPUs (must precede any TF op)."""
    from stratoflow.training.strategies import configure_host_devices

    configure_host_devices(TEST_LOGICAL_CPUS)
    import tensorflow as tf

    return tf


def fresh_mlflow_client(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[object]:
    """For a module-scoped fixture: an MlflowClient on a new SQLite store, set as the tracking
    URI (so Airflow subprocesses started meanwhile use it too) until the fixture ends."""
    from stratoflow.config import locations
    from stratoflow.tracking import mlflow_runs

    store = tmp_path_factory.mktemp(name) / "mlflow.db"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(locations.TRACKING_URI_ENV, f"sqlite:///{store}")
        yield mlflow_runs.client()


# Fixtures for tests that start processes (tests/support/processes.py).
from tests.support.processes import child_watcher, private_tmpdir  # noqa: E402, F401
