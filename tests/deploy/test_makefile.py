"""What each `make` target installs (docs/reference/install.md), read from `make -n -B`.

`-B` prints every recipe as if nothing were installed yet (a fresh clone); `-n` runs none.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from stratoflow.config import locations


def dry_run(*args: str) -> str:
    return subprocess.run(
        ["make", "-n", "-B", *args],
        cwd=locations.PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def installed(recipe: str) -> list[str]:
    """The project specs the recipe installs (`.` for the base install, `.[a,b]`)."""
    return re.findall(r"uv pip install --python \S+ -e '([^']*)'", recipe)


@pytest.mark.parametrize(
    ("args", "spec"),
    [
        (["run"], "."),
        (["services"], ".[services]"),
        (["services", "RAY=1"], ".[services,ray]"),
        (["docs"], ".[docs]"),
        (["install"], ".[dev]"),
        (["test"], ".[dev]"),
        (["lint"], ".[dev]"),
        (["bench"], ".[dev]"),
        (["run", "GPU=1"], ".[gpu]"),
    ],
)
def test_each_target_installs_the_extras_it_uses(args: list[str], spec: str) -> None:
    assert installed(dry_run(*args)) == [spec]


def test_make_run_compiles_no_bytecode_up_front_and_lets_its_processes_write_it() -> None:
    recipe = dry_run("run")

    assert "compileall" not in recipe
    assert re.search(r"^PYTHONDONTWRITEBYTECODE= \S+/stratoflow run ", recipe, re.MULTILINE)
    assert "compileall" in dry_run("install")  # the tests start many processes at once


def test_the_gpu_install_drops_tensorflow_cpu_which_owns_the_same_files() -> None:
    recipe = dry_run("run", "GPU=1")

    assert "tensorflow-cpu ; sys_platform == 'never'" in recipe
    assert re.search(r"uv pip uninstall --python \S+ tensorflow-cpu", recipe)
    assert "--override .venv/gpu-overrides.txt --reinstall-package tensorflow" in recipe
