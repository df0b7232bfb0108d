"""Where pipelines are found: a pipeline is a folder holding `pipeline.yaml` (and its own Python).

Pipelines come from the bundled examples (`stratoflow.pipelines`, unless
`STRATOFLOW_EXAMPLE_PIPELINES=0`) and from every entry of `STRATOFLOW_PIPELINES_PATH` (entries
separated by `os.pathsep`, `:` on Linux). An entry is either
a folder of pipeline folders (a team's repository of pipelines) or one pipeline folder itself
(it holds `pipeline.yaml`). The folder's name is the pipeline's name (`retrain_<name>`).

Problems found while looking (a missing path entry, a folder name that cannot be a pipeline name,
two folders claiming one name) do not stop discovery: they are reported in `Discovery.problems`
and the DAGs folder's `pipeline_errors.py` (`stratoflow.dags.raise_pipeline_errors`) shows them as
its import error, while the other pipelines load.

Light: the standard library only, nothing of the pipelines is imported here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

PIPELINE_FILE = "pipeline.yaml"
PIPELINES_PATH_ENV = "STRATOFLOW_PIPELINES_PATH"
# "0" leaves the bundled examples out; `stratoflow.dags.publish` sets it from its `examples`.
EXAMPLES_ENV = "STRATOFLOW_EXAMPLE_PIPELINES"
# The `stratoflow.pipelines` package holds the bundled pipeline folders: located, never imported.
BUNDLED_DIR = Path(str(resources.files("stratoflow.pipelines"))).resolve()
# A pipeline name becomes a DAG id suffix and the name of a Python package (its own modules).
NAME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


@dataclass
class Discovery:
    """What a look through the pipeline roots found.

    Attributes:
        folders: pipeline name → its folder, for every name claimed by exactly one folder.
        problems: pipeline name (or the path entry) → what is wrong; such a name has no folder.
    """

    folders: dict[str, Path] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)


def pipeline_roots() -> list[Path]:
    """The bundled examples' folder (unless left out), then each `$STRATOFLOW_PIPELINES_PATH`
    entry."""
    bundled = [BUNDLED_DIR] if os.environ.get(EXAMPLES_ENV, "1") != "0" else []
    return [*bundled, *(Path(entry).expanduser() for entry in _path_entries())]


def use_pipelines(folders: Iterable[str | os.PathLike[str]], *, examples: bool) -> None:
    """Make this process, and every process it starts, find the pipelines in `folders`.

    The folders join `$STRATOFLOW_PIPELINES_PATH` (those already there stay); `examples` decides
    whether the bundled examples are found too. Set in the environment on purpose: Airflow's task
    process parses the DAG file that called this before it runs a task, and the training processes
    it starts inherit the environment, so every one of them resolves a pipeline name alike.
    """
    entries = _path_entries()
    for folder in folders:
        entry = str(Path(folder).expanduser().absolute())
        if entry not in entries:
            entries.append(entry)
    os.environ[PIPELINES_PATH_ENV] = os.pathsep.join(entries)
    os.environ[EXAMPLES_ENV] = "1" if examples else "0"


def _path_entries() -> list[str]:
    return [entry for entry in os.environ.get(PIPELINES_PATH_ENV, "").split(os.pathsep) if entry]


def discover() -> Discovery:
    """Find every pipeline folder on the roots (`pipeline_roots`); called afresh each time."""
    claims: dict[str, list[Path]] = {}
    found = Discovery()
    for root in pipeline_roots():
        if not root.is_dir():
            found.problems[str(root)] = (
                f"{PIPELINES_PATH_ENV} entry {str(root)!r} is not a folder; each entry is a "
                f"folder of pipeline folders, or one pipeline folder (holding {PIPELINE_FILE})"
            )
            continue
        folders = (
            [root]
            if (root / PIPELINE_FILE).is_file()
            else sorted(p for p in root.iterdir() if (p / PIPELINE_FILE).is_file())
        )
        for folder in folders:
            claims.setdefault(folder.name, []).append(folder.resolve())
    for name, folders in sorted(claims.items()):
        unique = list(dict.fromkeys(folders))
        if not NAME_PATTERN.match(name):
            found.problems[name] = (
                f"{unique[0] / PIPELINE_FILE}: the folder name {name!r} is not a valid pipeline "
                "name (a letter, then letters, digits or '_'); rename the folder"
            )
        elif len(unique) > 1:
            found.problems[name] = (
                f"pipeline name {name!r} is claimed by {len(unique)} folders: "
                f"{', '.join(str(f) for f in unique)}; rename all but one (the folder name is "
                "the pipeline name)"
            )
        else:
            found.folders[name] = unique[0]
    return found
