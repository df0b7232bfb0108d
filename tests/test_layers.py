"""The house rules hold: one-way layers, pipelines through `stratoflow.api`, no import cycles.

The same check runs in `make lint`. The other tests here break a copy of the code on purpose
(an upward import, a cycle, each inside a function as a dodge would be) and see the check fail,
so that a check that could never fail would be noticed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stratoflow.config import locations

ROOT = locations.PROJECT_ROOT
# `stratoflow` brings `tasks/`, `pipelines/` and `dags/` along through its links.
PACKAGES = ("stratoflow", "benchmarks")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """Run `lint-imports` on the code under `root` with this repository's contracts."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def copy_of_the_code(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def add_function_local_import(module: Path, imported: str) -> None:
    module.write_text(module.read_text() + f"\n\ndef _dodge() -> None:\n    import {imported}\n")


def test_the_code_keeps_its_layers_and_has_no_cycles() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


def assert_broken(root: Path, contract: str, edge: str) -> None:
    """`lint-imports` on `root` fails, naming the broken contract and the import that breaks it."""
    result = lint_imports(root)
    assert result.returncode == 1, result.stdout
    assert contract in result.stdout and "BROKEN" in result.stdout
    assert edge in result.stdout


def test_an_upward_import_breaks_the_layers(copy_of_the_code: Path) -> None:
    # Configuration reaching up into a task body: the kind of import the layers forbid.
    add_function_local_import(
        copy_of_the_code / "stratoflow/config/names.py", "stratoflow.tasks.prepare"
    )
    assert_broken(
        copy_of_the_code, "One-way layers", "stratoflow.config.names -> stratoflow.tasks.prepare"
    )


def test_an_import_cycle_breaks_the_check(copy_of_the_code: Path) -> None:
    # `runner` imports `tables`; `tables` importing `runner` back closes a cycle inside one layer.
    add_function_local_import(
        copy_of_the_code / "stratoflow/cli/tables.py", "stratoflow.cli.runner"
    )
    assert_broken(copy_of_the_code, "No import cycles", ".tables -> .runner")


def test_pipeline_code_reaching_past_the_api_breaks_its_contract(copy_of_the_code: Path) -> None:
    # A bundled pipeline's module importing the engine directly, not through `stratoflow.api`.
    model = copy_of_the_code / "stratoflow/pipelines/penguins/model.py"
    model.write_text(model.read_text() + "\nfrom stratoflow.data import datasets\n")
    assert_broken(
        copy_of_the_code,
        "Pipeline code imports stratoflow.api only",
        "stratoflow.pipelines.penguins.model -> stratoflow.data.datasets",
    )


def test_the_engine_importing_a_benchmark_breaks_the_layers(copy_of_the_code: Path) -> None:
    # The benchmarks sit above the engine: the CLI may not reach up into them.
    add_function_local_import(copy_of_the_code / "stratoflow/cli/tables.py", "benchmarks.run")
    assert_broken(copy_of_the_code, "One-way layers", "stratoflow.cli.tables -> benchmarks.run")


# What a pipeline predicts is written `task:` in `pipeline.yaml`; these two mirror that key.
PROBLEM_TYPE_MIRRORS = {
    ("stratoflow/config/spec.py", "PipelineSpec"),
    ("stratoflow/config/features.py", "Target"),
}


def test_task_means_an_airflow_task_in_the_engines_own_names() -> None:
    """docs/explanation/architecture.md, "Words": a `task` is an Airflow task; classification or
    regression is a problem type, named so everywhere but the two mirrors of the `task:` key of
    `pipeline.yaml`."""
    import ast

    found = []
    for package in ("stratoflow", "tasks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            tree = ast.parse(path.read_text(), where)
            mirrors = {name for file, name in PROBLEM_TYPE_MIRRORS if file == where}
            mirrored = {
                id(node)
                for cls in ast.walk(tree)
                if isinstance(cls, ast.ClassDef) and cls.name in mirrors
                for node in ast.walk(cls)
            }
            for node in ast.walk(tree):
                if id(node) in mirrored:
                    continue
                if isinstance(node, ast.arg) and node.arg == "task":
                    found.append(f"{where}:{node.lineno} argument `task`")
                elif isinstance(node, ast.keyword) and node.arg == "task":
                    found.append(f"{where}:{node.lineno} keyword `task=`")
                elif isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "task":
                    found.append(f"{where}:{node.lineno} field `task`")
                elif isinstance(node, ast.Assign) and "classification" in ast.unparse(node.value):
                    named = [ast.unparse(t) for t in node.targets if "TASK" in ast.unparse(t)]
                    found += [f"{where}:{node.lineno} constant `{n}`" for n in named]
    assert found == []
