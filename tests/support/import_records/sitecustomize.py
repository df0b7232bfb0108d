"""Imported by every Python process that has this folder on its `PYTHONPATH` (a test sets it).

At exit, the process writes its command line and which of TensorFlow, Keras and MLflow it
imported into `$STRATOFLOW_TEST_IMPORT_RECORDS/<pid>.json`: a test reads what each process of a
real run imported (`tests.support.import_records.records`).
"""

import atexit
import json
import os
import sys

_FOLDER = os.environ.get("STRATOFLOW_TEST_IMPORT_RECORDS")
_WATCHED = ("tensorflow", "keras", "mlflow")


def _write() -> None:
    imported = [name for name in _WATCHED if name in sys.modules]
    with open(os.path.join(_FOLDER, f"{os.getpid()}.json"), "w") as stream:
        json.dump({"argv": sys.argv, "imported": imported}, stream)


if _FOLDER:
    atexit.register(_write)
