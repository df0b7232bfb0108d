"""Which heavy packages each process of a real run imported: `recording` puts `sitecustomize.py`
(this folder) on the `PYTHONPATH` of every process started inside it; `records` reads what they
wrote at exit. The processes that run pipeline code (training, the serving check) are handed the
pipeline environment, which drops the folder's variable: they record nothing."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

FOLDER_ENV = "STRATOFLOW_TEST_IMPORT_RECORDS"


@contextlib.contextmanager
def recording(folder: Path) -> Iterator[None]:
    """Every Python process started inside the block records its imports into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    here = str(Path(__file__).parent)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", path)
        patch.setenv(FOLDER_ENV, str(folder))
        yield


def records(folder: Path) -> list[dict]:
    """Each process's record: `argv` (its command line) and `imported` (of TensorFlow, Keras and
    MLflow, those it imported)."""
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]
