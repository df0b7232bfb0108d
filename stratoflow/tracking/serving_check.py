"""Serving validation before promotion: the registered version, served in a fresh process, must
answer the test examples as the evaluated model did.

The gate judged the Keras model the training task saved. What `champion` will serve is another
thing: the registered version's files, loaded through its `python_function` flavor (the loader
shipped in its `code/` folder, the Keras file, the logged signature) by a process that has never
seen the training. A custom layer the fresh process cannot import, a layer whose behaviour
depends on state the training process had, or a signature that refuses the model's own inputs
all pass the gate and fail only when someone serves the model. So before `champion` moves:

1. the version is copied from the registry (`models:/<name>/<version>`) into a private folder,
   as `stratoflow serve-model` does (`model_serving.download_model`);
2. a fresh Python process (`python -m stratoflow.tracking.serving_check`, in that folder, with
   the environment the caller built: no MLflow credentials, nothing of Airflow's) loads the copy
   with `mlflow.pyfunc.load_model` and answers a JSON request through MLflow's own scoring code
   (`scoring_server.invocations`: the request parsed against the logged signature, the answer
   serialised as the scoring server sends it). The process may be started ahead
   (`start_fresh_process`, as the registration task does before it logs the version): it imports
   MLflow's scoring code and Keras (what serving the version loads anyway, most of the check's
   seconds) while the caller logs and registers the version, then waits for the one request it
   answers; it has still seen nothing of the training, and loads nothing of the version before
   it is asked;
3. its answers are compared with the evaluated model's outputs on the same examples.

Tolerance: the same weights run by the same TensorFlow on the same CPU give the same float32
results up to the order of summation inside a kernel (which a different batch size can change):
a few units of float32's 1.2e-7 per value. Class probabilities (in [0, 1]) may therefore differ
by at most `PROBABILITY_TOLERANCE` = 1e-4 (about a thousand times that noise, and a hundred times
below any change of behaviour worth serving), and regression predictions by 1e-4 of their scale
(`max(|prediction|, 1)`). Examples: the first 256 of the test split, as the training process
recorded them (`stratoflow.training.recorded_outputs.EXAMPLES`; all of
them for the bundled datasets but mnist's 500): the check's cost is the fresh process importing
TensorFlow and loading the model (seconds), not the examples, and more examples reach more
classes and more input values.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stratoflow.config.features import Target

logger = logging.getLogger(__name__)

PROBABILITY_TOLERANCE = 1e-4
PREDICTION_RELATIVE_TOLERANCE = 1e-4
# Importing TensorFlow and loading a model took 10-25 s here; a process that has not answered in
# this long is stuck, and the version is not served.
CHECK_TIMEOUT_SECONDS = 300
# What is quoted of a failed fresh process: the exception it ended with, else its last lines.
QUOTED_LINES = 8
QUOTED_CHARS = 2000
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b.*:")
_REQUEST, _ANSWER, _STDERR = "request.json", "answer.json", "stderr.txt"


@dataclass(frozen=True)
class ServingCheck:
    """The serving check's verdict.

    Attributes:
        passed: the served version answered every example like the evaluated model.
        reason: why not (or, when it passed, what was compared).
        examples: how many test examples it answered.
        max_difference: the largest difference between the two models' answers (None when it
            gave no comparable answer).
        seconds: the check's duration, copy and fresh process included.
    """

    passed: bool
    reason: str
    examples: int
    max_difference: float | None
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def tag(self) -> str:
        """What the version and the run are tagged with."""
        return f"{'passed' if self.passed else 'failed'}: {self.reason}"


def check_served_answers(
    model_uri: str,
    features: Any,
    outputs: Any,
    target: Target,
    environment: Mapping[str, str],
    preexec_fn: Callable[[], None] | None = None,
    fresh: FreshProcess | None = None,
) -> ServingCheck:
    """Serve the registered version `model_uri` in a fresh process and compare its answers.

    Args:
        model_uri: the version's registry URI, `models:/<name>/<version>`.
        features: the test examples it answers (`datasets.load_arrays`: an image array or a dict
            of columns), as recorded (`stratoflow.training.recorded_outputs.EXAMPLES`).
        outputs: the evaluated model's outputs on the same examples (logits, or predictions).
        target: what the model predicts (task, class names).
        environment: the fresh process's whole environment.
        preexec_fn: run in the child before it starts (e.g. to die with its parent).
        fresh: the fresh process, if started ahead (`start_fresh_process`); closed here.

    Raises:
        Exception: the registry did not give the version's files (an MLflow error: a retry may
            get past it). A version that does not load, refuses the request or answers otherwise
            is a failed check, not an exception.
    """
    started = time.monotonic()
    answer, failure = serve_in_fresh_process(model_uri, features, environment, preexec_fn, fresh)
    if answer is None:
        return ServingCheck(False, failure, len(outputs), None, time.monotonic() - started)
    passed, reason, difference = compare_answers(answer, outputs, target)
    return ServingCheck(passed, reason, len(outputs), difference, time.monotonic() - started)


class FreshProcess:
    """A fresh Python process in a private folder, started ahead of its one serving check
    (`start_fresh_process`); `close()` ends it and removes the folder."""

    def __init__(
        self, environment: Mapping[str, str], preexec_fn: Callable[[], None] | None = None
    ) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="stratoflow-serving-check-")
        self.work = Path(self._folder.name)
        self._stderr = open(self.work / _STDERR, "w")  # noqa: SIM115  (closed in close())
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__],
            cwd=self.work,  # not the project's folder: nothing of it is importable by accident
            env=dict(environment),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            text=True,
            preexec_fn=preexec_fn,
        )

    def answer(self, model_dir: str, request: str) -> tuple[Any, str]:
        """Have it load `model_dir` and answer `request` (a JSON body) as the scoring server
        would.

        Returns:
            (the scoring server's JSON answer, "") or (None, why it gave none).
        """
        (self.work / _REQUEST).write_text(request)
        try:
            self.process.communicate(
                json.dumps([model_dir, _REQUEST, _ANSWER]) + "\n", timeout=CHECK_TIMEOUT_SECONDS
            )
        except subprocess.TimeoutExpired:
            return None, f"the served version did not answer within {CHECK_TIMEOUT_SECONDS} s"
        if self.process.returncode != 0:
            self._stderr.flush()
            stderr = (self.work / _STDERR).read_text(errors="replace")
            error = _error_of(stderr, self.process.returncode)
            return None, f"the served version failed in a fresh process: {error}"
        return json.loads((self.work / _ANSWER).read_text()), ""

    def close(self) -> None:
        """End the process if it still runs (a check that was not needed) and remove its
        folder."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._stderr.close()
        self._folder.cleanup()


def start_fresh_process(
    environment: Mapping[str, str], preexec_fn: Callable[[], None] | None = None
) -> FreshProcess:
    """Start the fresh process of a serving check now, to answer later (`serve_in_fresh_process`).

    Args:
        environment: the fresh process's whole environment.
        preexec_fn: run in the child before it starts (e.g. to die with its parent).
        fresh: the fresh process, if started ahead (`start_fresh_process`); closed here.
    """
    return FreshProcess(environment, preexec_fn)


def serve_in_fresh_process(
    model_uri: str,
    features: Any,
    environment: Mapping[str, str],
    preexec_fn: Callable[[], None] | None = None,
    fresh: FreshProcess | None = None,
) -> tuple[Any, str]:
    """Copy the version out of the registry and have a fresh process answer `features` with it,
    as the scoring server would.

    Args:
        fresh: a fresh process started ahead (`start_fresh_process`), used and closed here;
            None starts one (with `environment` and `preexec_fn`).

    Returns:
        (the scoring server's JSON answer, "") or (None, why it gave none).
    """
    import mlflow.artifacts

    process = fresh if fresh is not None else start_fresh_process(environment, preexec_fn)
    try:
        copy = mlflow.artifacts.download_artifacts(
            artifact_uri=model_uri, dst_path=str(process.work / "model")
        )
        return process.answer(copy, request_body(features))
    finally:
        process.close()


def request_body(features: Any) -> str:
    """The JSON a client sends the scoring server: a table (`dataframe_split`) of the columns,
    or the images as nested lists (`inputs`)."""
    import numpy as np

    if isinstance(features, dict):
        columns = list(features)
        rows = np.stack([np.asarray(features[c]) for c in columns], axis=1).tolist()
        # Categorical ids stay integers: the signature's column types are checked.
        data = [
            [
                int(v) if features[c].dtype.kind in "iu" else float(v)
                for c, v in zip(columns, row, strict=True)
            ]
            for row in rows
        ]
        return json.dumps({"dataframe_split": {"columns": columns, "data": data}})
    return json.dumps({"inputs": np.asarray(features, dtype="float32").tolist()})


def expected_answers(outputs: Any, target: Target) -> Any:
    """What the served model should answer for the evaluated model's outputs: class
    probabilities (softmax of the logits), or the predictions."""
    import numpy as np

    values = np.asarray(outputs, dtype="float64").reshape(len(outputs), -1)
    if target.task == "classification":
        shifted = values - values.max(axis=-1, keepdims=True)
        return np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)
    return values


def compare_answers(answer: Any, outputs: Any, target: Target) -> tuple[bool, str, float | None]:
    """Whether the served answer matches the evaluated outputs within the tolerance.

    Returns:
        (passed, what was found, the largest difference or None).
    """
    import numpy as np

    expected = expected_answers(outputs, target)
    rows = answer.get("predictions") if isinstance(answer, dict) else None
    if not isinstance(rows, list) or len(rows) != len(expected):
        return (
            False,
            f"the served version answered {_describe(rows)} for {len(expected)} examples",
            None,
        )
    if target.task == "classification":
        columns = [f"probability_{name}" for name in target.class_names]
        tolerance = np.full(expected.shape, PROBABILITY_TOLERANCE)
        what = "class probabilities"
    else:
        width = expected.shape[1]
        columns = ["prediction"] if width == 1 else [f"prediction_{i}" for i in range(width)]
        tolerance = PREDICTION_RELATIVE_TOLERANCE * np.maximum(np.abs(expected), 1.0)
        what = "predictions"
    missing = [c for c in columns if not isinstance(rows[0], dict) or c not in rows[0]]
    if missing:
        return False, f"the served answer lacks {', '.join(missing[:3])}", None
    served = np.array([[float(row[c]) for c in columns] for row in rows])
    difference = np.abs(served - expected)
    largest = float(difference.max())
    over = np.argwhere(difference > tolerance)
    if len(over):
        example, column = (int(i) for i in over[0])
        return (
            False,
            f"served {what} differ from the evaluated model's on {len(np.unique(over[:, 0]))} of "
            f"{len(expected)} test examples, by up to {largest:.3g} (tolerance "
            f"{PROBABILITY_TOLERANCE if target.task == 'classification' else 'relative 1e-4'}); "
            f"first: example {example}, {columns[column]} {served[example, column]:.6g} served, "
            f"{expected[example, column]:.6g} evaluated",
            largest,
        )
    return (
        True,
        f"{len(expected)} test examples answered as evaluated (largest difference {largest:.3g})",
        largest,
    )


def _error_of(stderr: str, returncode: int) -> str:
    """The exception a failed process ended with (from the last line naming one), else its last
    lines; at most `QUOTED_CHARS` characters."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    raised = [i for i, line in enumerate(lines) if _EXCEPTION_LINE.match(line)]
    # The exception's message may span lines: from its first line to the end.
    text = " | ".join(lines[raised[-1] :] if raised else lines[-QUOTED_LINES:])
    text = text or f"exit code {returncode}"
    return text if len(text) <= QUOTED_CHARS else text[: QUOTED_CHARS - 1] + "…"


def _describe(rows: Any) -> str:
    return (
        f"{len(rows)} rows" if isinstance(rows, list) else f"no predictions ({type(rows).__name__})"
    )


def _answer(model_dir: str, request_file: str, answer_file: str) -> int:
    """Load the copy as the scoring server does and answer the request."""
    import mlflow.pyfunc
    from mlflow.pyfunc import scoring_server

    model = mlflow.pyfunc.load_model(model_dir)
    response = scoring_server.invocations(
        Path(request_file).read_text(),
        "application/json",
        model,
        model.metadata.get_input_schema(),
    )
    if response.status != 200:
        sys.stderr.write(f"the scoring server answered {response.status}: {response.response}\n")
        return 1
    Path(answer_file).write_text(response.response)
    return 0


def _answer_when_asked() -> int:
    """The fresh process: import what serving the version loads anyway, then answer the one
    request that arrives on stdin (`[model_dir, request_file, answer_file]`); none: exit."""
    import keras  # noqa: F401  (the version's loader imports it; its import is most of the wait)
    import mlflow.pyfunc  # noqa: F401
    from mlflow.pyfunc import scoring_server  # noqa: F401

    line = sys.stdin.readline()
    if not line.strip():
        return 0
    model_dir, request_file, answer_file = json.loads(line)
    return _answer(model_dir, request_file, answer_file)


if __name__ == "__main__":
    sys.exit(_answer_when_asked())
