"""`stratoflow.api`: the one module pipeline code imports; cheap to import, and kept to.

The source walks below read the import statements themselves (`ast`), so a test module or a
benchmark that reaches for a private name, or a pipeline (bundled, or written by `new-pipeline`)
that reaches past `stratoflow.api` into the engine, fails here with the file and line.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratoflow.config import locations, scaffold

ROOT = locations.PROJECT_ROOT
# The project's own top-level packages: an import of one of them is an import of project code.
PROJECT_PACKAGES = ("stratoflow", "tasks", "dags", "pipelines", "benchmarks")
# What importing `stratoflow.api` must not pull in (each costs seconds or is not installed where
# a pipeline's code is edited).
HEAVY_MODULES = ("tensorflow", "keras", "tensorflow_datasets", "mlflow", "airflow", "ray")


def imports_in(path: Path) -> Iterator[tuple[int, str, list[str]]]:
    """Every import statement of a file: (line, module, names imported from it)."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module, [alias.name for alias in node.names]


def python_files(*folders: Path) -> list[Path]:
    files = [p for folder in folders for p in folder.rglob("*.py") if "__pycache__" not in p.parts]
    assert files, f"no Python files under {folders}"
    return sorted(files)


def engine_imports_besides_the_api(files: list[Path]) -> list[str]:
    found = []
    for path in files:
        for line, module, _ in imports_in(path):
            top = module.split(".")[0]
            if top in PROJECT_PACKAGES and top != "pipelines" and module != "stratoflow.api":
                found.append(f"{path}:{line}: {module}")
    return found


def test_the_bundled_pipelines_import_only_stratoflow_api() -> None:
    assert engine_imports_besides_the_api(python_files(ROOT / "pipelines")) == []


@pytest.mark.parametrize("example", scaffold.examples())
def test_new_pipeline_writes_code_that_imports_only_stratoflow_api(
    example: str, tmp_path: Path
) -> None:
    folder = scaffold.new_pipeline("mine", example, tmp_path)
    code = sorted(folder.rglob("*.py"))
    if example == scaffold.STARTER:
        assert {p.name for p in code} >= {"model.py", "preprocess.py"}
    assert engine_imports_besides_the_api(code) == []
    # What the pipeline code names from the API, the API has.
    import stratoflow.api

    for path in code:
        for line, module, names in imports_in(path):
            if module == "stratoflow.api":
                missing = set(names) - set(stratoflow.api.__all__)
                assert not missing, f"{path}:{line}: {missing} not in stratoflow.api.__all__"


def test_benchmarks_and_tests_import_no_private_name() -> None:
    private = []
    for path in python_files(ROOT / "benchmarks", ROOT / "tests"):
        for line, module, names in imports_in(path):
            if module.split(".")[0] not in PROJECT_PACKAGES:
                continue
            hidden_modules = [part for part in module.split(".") if part.startswith("_")]
            hidden_names = [name for name in names if name.startswith("_")]
            if hidden_modules or hidden_names:
                private.append(f"{path}:{line}: from {module} import {', '.join(names)}")
    assert private == []


def test_importing_the_api_imports_neither_tensorflow_nor_mlflow() -> None:
    script = (
        "import json, sys, stratoflow.api\n"
        f"print(json.dumps([m for m in {list(HEAVY_MODULES)!r} if m in sys.modules]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_the_api_names_are_the_ones_the_engine_hands_over() -> None:
    import stratoflow.api as api
    from stratoflow.config import features

    assert sorted(api.__all__) == sorted(set(api.__all__)), "a name listed twice"
    for name in api.__all__:
        assert hasattr(api, name), f"stratoflow.api.__all__ lists {name!r}, which it lacks"
    # The old import keeps working for pipelines written before the API: the same classes, so an
    # `isinstance` check or a type annotation means the same with either import.
    assert api.Features is features.Features and api.Target is features.Target
    assert api.Column is features.Column


def test_the_split_helper_orders_by_seed_and_splits_each_class_80_10_10() -> None:
    from stratoflow.api import seeded_order, stratified_split

    order = seeded_order(range(100), seed=7)
    assert sorted(order) == list(range(100)) and order != list(range(100))
    assert seeded_order(range(100), seed=7) == order and seeded_order(range(100), seed=8) != order
    # A subset is ordered as it is ordered within the whole: a class's order does not depend on
    # the other classes (what a per-class split relies on).
    evens = seeded_order(range(0, 100, 2), seed=7)
    assert evens == [i for i in order if i % 2 == 0]

    labels = [0] * 50 + [1] * 30
    splits = stratified_split(labels, seed=7)
    assert {name: len(ids) for name, ids in splits.items()} == {
        "train": 40 + 24,
        "validation": 5 + 3,
        "test": 5 + 3,
    }
    assert sorted(i for ids in splits.values() for i in ids) == list(range(80))


def test_stratoflow_check_finds_a_pipelines_imports_past_the_api(tmp_path: Path) -> None:
    from stratoflow.config.plugins import engine_imports

    (tmp_path / "model.py").write_text(
        "import keras\nimport stratoflow.api\nfrom stratoflow import api\n"
        "from stratoflow.api import Features\nfrom . import layers\n"
    )
    (tmp_path / "layers.py").write_text(
        "def make():\n    from stratoflow.training import models\n"
        "import stratoflow.config.features as features\nfrom stratoflow import config\n"
    )
    (tmp_path / "broken.py").write_text("def (:\n")  # left to the import that reports it
    assert engine_imports(tmp_path) == [
        "layers.py:2: stratoflow.training",
        "layers.py:3: stratoflow.config.features",
        "layers.py:4: stratoflow",
    ]
