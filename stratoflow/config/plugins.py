"""A pipeline's own code, by import path: `module:name`, the module in the pipeline folder first.

`model.builder: "model:build"` names the function `build` of `model.py` in the pipeline's folder
(or of `model/__init__.py`); a module not found there is imported as any installed module
(`my_team.models:build`). A pipeline folder becomes the package `stratoflow_pipeline_<name>`, so
two pipelines may each have a `model.py`, and the modules of one folder import each other
relatively (`from . import layers`).

Only task and training processes call `load_object`: DAG parsing never imports a pipeline's code.
`engine_imports` reads the code without importing it: where it reaches past `stratoflow.api`.
"""

from __future__ import annotations

import ast
import importlib
import sys
import types
from pathlib import Path
from typing import Any

from stratoflow.config.parsing import SpecError

PACKAGE_PREFIX = "stratoflow_pipeline_"
# The one module of stratoflow that pipeline code is promised (docs/reference/pipeline-code.md).
API_MODULE = "stratoflow.api"


def pipeline_package(folder: str | Path) -> str:
    """The package name of a pipeline folder, registered in `sys.modules` on first use."""
    path = Path(folder).resolve()
    name = PACKAGE_PREFIX + path.name
    package = sys.modules.get(name)
    if package is None or list(getattr(package, "__path__", [])) != [str(path)]:
        # Another folder of the same name was loaded before: forget its modules.
        for loaded in [key for key in sys.modules if key.startswith(f"{name}.")]:
            del sys.modules[loaded]
        package = types.ModuleType(name, f"the modules of pipeline folder {path}")
        package.__path__ = [str(path)]
        # Where the package lives: TFDS locates a builder's code (checksums) through it.
        package.__file__ = str(path / "__init__.py")
        sys.modules[name] = package
    return name


def import_module(module: str, folder: str | Path | None, where: str) -> types.ModuleType:
    """Import `module` from the pipeline folder if it is there, else from the installed ones.

    Raises:
        SpecError: the module is found nowhere, or importing it raised (the message names
            `where`, the file and field, and the error).
    """
    top = module.split(".")[0]
    local = folder is not None and (
        (Path(folder) / f"{top}.py").is_file() or (Path(folder) / top / "__init__.py").is_file()
    )
    qualified = f"{pipeline_package(folder)}.{module}" if local and folder is not None else module
    try:
        return importlib.import_module(qualified)
    except ModuleNotFoundError as error:
        if error.name and qualified.startswith(error.name):
            place = f"in the pipeline folder {folder} nor " if folder else ""
            raise SpecError(
                f"{where}: module {module!r} is found neither {place}among the installed modules"
            ) from None
        raise SpecError(f"{where}: importing {module!r} failed: {error}") from error
    except Exception as error:
        raise SpecError(
            f"{where}: importing {module!r} failed: {type(error).__name__}: {error}"
        ) from error


def load_object(path: str, folder: str | Path | None, where: str) -> Any:
    """The object an import path `module:name` names.

    Args:
        path: `module:name` (`model:build`, `my_team.data:Penguins`).
        folder: the pipeline folder, searched first; None for installed modules only.
        where: the file and field, for error messages (`/x/pipeline.yaml: model.builder`).

    Raises:
        SpecError: the module or the name does not resolve; the message names `where`.
    """
    module_name, _, attribute = path.partition(":")
    module = import_module(module_name, folder, where)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise SpecError(
            f"{where}: {path!r} does not resolve: module {module_name!r} "
            f"({getattr(module, '__file__', None)}) has no {attribute!r}"
        ) from None


def engine_imports(folder: str | Path) -> list[str]:
    """Where a pipeline folder's Python imports stratoflow other than `stratoflow.api`.

    Read, not imported: a module that does not parse is left to the import that reports it.

    Returns:
        `file:line: module` for each such import, files relative to `folder`, in file order.
    """
    root = Path(folder)
    found = []
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(), filename=str(path))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
        for node in sorted(imports, key=lambda n: n.lineno):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from stratoflow import api` is the API too.
                names = {alias.name for alias in node.names}
                modules = [] if node.module == "stratoflow" and names == {"api"} else [node.module]
            else:
                continue
            found += [
                f"{path.relative_to(root)}:{node.lineno}: {module}"
                for module in modules
                if module.split(".")[0] == "stratoflow" and module != API_MODULE
            ]
    return found
