"""A feature whose extra is not installed is refused up front, naming the extra to install.

The dev install holds every extra, so each test runs `stratoflow` in a child process where the
extra's modules are made unimportable (`sys.modules[name] = None`, which makes an import raise
ImportError and `find_spec` find nothing): the path a base install takes, in a real process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stratoflow.config import extras, locations

# Runs `stratoflow` (argv from the command line) with the named modules unimportable.
_WITHOUT = """
import sys
names, argv = sys.argv[1].split(","), sys.argv[2:]
for name in names:
    sys.modules[name] = None
from stratoflow.cli.main import main
sys.exit(main(argv))
"""


def stratoflow_without(modules: list[str], *argv: str) -> subprocess.CompletedProcess[str]:
    """`stratoflow ARGV` in a child process in which `modules` cannot be imported."""
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT, ",".join(modules), *argv],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONPATH": str(locations.PROJECT_ROOT)},
    )


def test_every_extra_is_installed_in_the_dev_install() -> None:
    assert {name: extras.missing_modules(name) for name in extras.EXTRAS} == {
        name: [] for name in extras.EXTRAS
    }


def test_a_run_with_launcher_ray_without_ray_is_refused_before_airflow_naming_the_extra() -> None:
    result = stratoflow_without(["ray"], "run", "digits", "--conf", '{"launcher": "ray"}')

    assert result.returncode == 1, result.stderr
    assert "launcher 'ray' needs stratoflow's 'ray' extra" in result.stderr
    assert "pip install 'stratoflow[ray]'" in result.stderr
    assert "DAG TEST" not in result.stderr  # refused before `airflow dags test` started


def test_a_pipeline_yaml_with_launcher_ray_without_ray_fails_its_spec_check(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "mine"
    shutil.copytree(locations.PROJECT_ROOT / "pipelines" / "digits", folder)
    spec = folder / "pipeline.yaml"
    spec.write_text(spec.read_text().replace("  epochs: 20\n", "  epochs: 20\n  launcher: ray\n"))

    result = stratoflow_without(["ray"], "check", str(tmp_path))

    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        f"FAIL  spec: {spec}: training.launcher 'ray' needs stratoflow's 'ray' extra, which is "
        "not installed (no module 'ray'): install stratoflow[ray]"
    ) in result.stdout


@pytest.mark.parametrize("missing", ["airflow.providers.fab", "psycopg2"])
def test_services_up_without_the_services_extra_starts_nothing_and_names_it(
    tmp_path: Path, missing: str
) -> None:
    state = tmp_path / "stack"

    result = stratoflow_without([missing], "services", "up", "--state-dir", str(state))

    assert result.returncode == 1, result.stderr
    assert "stratoflow services up needs stratoflow's 'services' extra" in result.stderr
    assert f"no module {missing!r}" in result.stderr
    assert "pip install 'stratoflow[services]'" in result.stderr
    assert not state.exists()


def test_services_up_with_ray_without_ray_starts_nothing_and_names_the_extra(
    tmp_path: Path,
) -> None:
    state = tmp_path / "stack"

    result = stratoflow_without(["ray"], "services", "up", "--ray", "--state-dir", str(state))

    assert result.returncode == 1, result.stderr
    assert "stratoflow services up --ray needs stratoflow's 'ray' extra" in result.stderr
    assert not state.exists()


def test_a_subpackage_is_found_without_importing_its_parents() -> None:
    code = (
        "import sys\n"
        "from stratoflow.config import extras\n"
        "found = extras.missing_modules('services')\n"
        "print(found, 'airflow' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )

    assert result.stdout.strip() == "[] False"  # found, and Airflow (seconds to import) untouched
