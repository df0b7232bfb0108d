"""The opt-in parts of the install (pyproject.toml's extras) and the check that one is there.

`pip install stratoflow` runs a pipeline on this host with every strategy (`stratoflow run`,
`airflow dags test`, embedded SQLite stores); the Ray launcher and the services stack need an
extra. What needs one calls `require` as early as it can (a run's `launcher: ray` when its
settings are checked, `stratoflow services up` before it starts anything), so a missing extra is
named with the command that installs it instead of surfacing as an ImportError deep in a run.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

# Each extra, by its name in pyproject.toml, with the modules stratoflow imports from it. A
# module is checked without being imported: Ray's import alone takes seconds, Airflow's more.
EXTRAS: dict[str, tuple[str, ...]] = {
    "ray": ("ray",),
    "services": ("airflow.providers.fab", "psycopg2"),
}


class MissingExtra(RuntimeError):
    """A feature needs an extra of the install that is not installed; the message names it."""


def missing_modules(extra: str) -> list[str]:
    """The modules of `extra` that cannot be imported here (none when it is installed)."""
    return [module for module in EXTRAS[extra] if not _importable(module)]


def require(extra: str, needed_for: str) -> None:
    """Raise `MissingExtra` unless every module of `extra` can be imported.

    Args:
        extra: an extra's name (a key of `EXTRAS`).
        needed_for: what needs it, as the user named it (`training.launcher 'ray'`).
    """
    missing = missing_modules(extra)
    if missing:
        raise MissingExtra(
            f"{needed_for} needs stratoflow's {extra!r} extra, which is not installed (no "
            f"module {', '.join(map(repr, missing))}): install stratoflow[{extra}] "
            f"(pip install 'stratoflow[{extra}]'; in a checkout, make install)"
        )


def _importable(module: str) -> bool:
    """Whether `module` can be imported, found without importing it or its parents.

    `importlib.util.find_spec("airflow.providers.fab")` would import Airflow for the answer:
    only the top-level package is looked up so, its subpackages as folders in its locations.
    """
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        prefix = ".".join(parts[:depth])
        if prefix in sys.modules and sys.modules[prefix] is None:  # made unimportable
            return False
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    folders = [Path(folder) for folder in spec.submodule_search_locations or ()]
    for part in parts[1:]:
        folders = [folder / part for folder in folders if (folder / part).is_dir()]
    return bool(folders) or len(parts) == 1
