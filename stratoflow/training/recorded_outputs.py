"""What the training process records of the saved model on the test split, so that the tasks
after it score, log and check the model without TensorFlow.

The chief writes it once the model is saved (`record`, `FILE_NAME` in the run folder): the saved
model's outputs on the whole test split, the targets, the gate's slices of the split (from the
features before the pipeline's preprocessing), the first test examples (what the serving check
sends a served version, and the model's input example) and the TensorFlow and Keras builds it
trained with (the served model's requirements).

The Airflow tasks read it (`RecordedOutputs.load`) and so run none of the pipeline's code and
import no TensorFlow in the process that holds Airflow's and MLflow's secrets. The file is read
without pickle: the process that wrote it ran pipeline code.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stratoflow.training.slices import TestSlice

FILE_NAME = "test_outputs.npz"
# The first test examples kept: what the serving check (`stratoflow.tracking.serving_check`) sends
# a served version; its cost is the fresh process's imports, not the examples. Defined here, not
# there: the training process may import no module that imports MLflow.
EXAMPLES = 256
_COLUMN = "example_column."  # a tabular example's column, by name


@dataclass(frozen=True)
class RecordedOutputs:
    """The saved model on the test split, as the training process scored it.

    Attributes:
        outputs: the model's outputs on every test example (logits, or predictions).
        targets: the test split's targets, in the same order.
        examples: its first examples as the model takes them (an image array, or a dict of
            column arrays), at most `EXAMPLES`; `outputs` starts with theirs.
        slices: the gate's slices of the split, with their masks.
        versions: the distributions that trained it: the TensorFlow build
            (`tensorflow-cpu` or `tensorflow`) and `keras`, with their versions.
    """

    outputs: np.ndarray
    targets: np.ndarray
    examples: Any
    slices: list[TestSlice] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)

    def requirements(self) -> list[str]:
        """`versions` as pip requirements (`tensorflow-cpu==2.21.0`)."""
        return [f"{name}=={version}" for name, version in self.versions.items()]

    def example_outputs(self) -> np.ndarray:
        """The model's outputs on `examples`."""
        return self.outputs[: _count(self.examples)]

    def save(self, path: Path) -> None:
        """Write it to `path` (an `.npz`), whole or not at all."""
        arrays: dict[str, np.ndarray] = {
            "outputs": np.asarray(self.outputs),
            "targets": np.asarray(self.targets),
            "slice_names": np.array([s.name for s in self.slices], dtype=str),
            "slice_descriptions": np.array([s.description for s in self.slices], dtype=str),
            "slice_max_regressions": np.array([s.max_regression for s in self.slices], float),
            "slice_masks": np.array([s.mask for s in self.slices], dtype=bool).reshape(
                len(self.slices), len(self.targets)
            ),
            "version_names": np.array(list(self.versions), dtype=str),
            "version_numbers": np.array(list(self.versions.values()), dtype=str),
        }
        if isinstance(self.examples, dict):
            arrays.update({_COLUMN + name: values for name, values in self.examples.items()})
        else:
            arrays["examples"] = np.asarray(self.examples)
        partial = path.with_name(path.name + ".partial")
        with open(partial, "wb") as stream:
            np.savez(stream, allow_pickle=False, **arrays)
        os.replace(partial, path)

    @classmethod
    def load(cls, path: str | Path) -> RecordedOutputs:
        """Read what `save` wrote.

        Raises:
            FileNotFoundError: nothing was recorded there, or no path was given (a training
                task of an earlier stratoflow recorded nothing).
        """
        if not path:
            raise FileNotFoundError(
                "the training task recorded no test outputs (it ran an earlier stratoflow): "
                "clear train_model and the tasks after it to train and record again"
            )
        with np.load(path, allow_pickle=False) as data:
            columns = {
                key.removeprefix(_COLUMN): data[key]
                for key in data.files
                if key.startswith(_COLUMN)
            }
            slices = [
                TestSlice(str(name), str(description), mask, float(allowed))
                for name, description, mask, allowed in zip(
                    data["slice_names"],
                    data["slice_descriptions"],
                    data["slice_masks"],
                    data["slice_max_regressions"],
                    strict=True,
                )
            ]
            return cls(
                outputs=data["outputs"],
                targets=data["targets"],
                examples=columns or data["examples"],
                slices=slices,
                versions=dict(
                    zip(
                        map(str, data["version_names"]),
                        map(str, data["version_numbers"]),
                        strict=True,
                    )
                ),
            )


def record(spec: Any, dataset: Any, model_path: str, run_dir: Path) -> Path:
    """Score the saved model on the test split and write what the later tasks need.

    Args:
        spec: the run's resolved pipeline spec (its gate's slices).
        dataset: the prepared `DatasetRef`.
        model_path: the saved Keras model.
        run_dir: the run folder, where `FILE_NAME` goes.

    Returns:
        The file written.
    """
    import dataclasses

    from stratoflow.data import datasets
    from stratoflow.training import slices

    features, targets = datasets.load_arrays(dataset, "test")
    test_slices: list[TestSlice] = []
    if spec.evaluation.slices is not None:
        # Feature slices read the dataset's own values, before the pipeline's preprocessing.
        raw_features, _ = datasets.load_arrays(
            dataclasses.replace(dataset, preprocess=None), "test"
        )
        test_slices = slices.build_slices(
            spec.evaluation.slices, raw_features, targets, dataset.features, dataset.target
        )
    recorded = score(model_path, features, targets, test_slices)
    path = run_dir / FILE_NAME
    recorded.save(path)
    return path


def score(
    model_path: str, features: Any, targets: np.ndarray, test_slices: Sequence[TestSlice] = ()
) -> RecordedOutputs:
    """The saved model's outputs on `features` (`datasets.load_arrays`), loaded from its file as
    a user of the registered version would."""
    from stratoflow.tracking import environment
    from stratoflow.training import evaluation

    outputs = evaluation.predict_outputs(model_path, features)
    examples = (
        {name: values[:EXAMPLES] for name, values in features.items()}
        if isinstance(features, dict)
        else features[:EXAMPLES]
    )
    return RecordedOutputs(
        outputs=outputs,
        targets=np.asarray(targets),
        examples=examples,
        slices=list(test_slices),
        versions=environment.training_distributions(),
    )


def _count(examples: Any) -> int:
    if isinstance(examples, dict):
        return len(next(iter(examples.values())))
    return len(examples)
