"""What the training process records for the tasks after it: read back whole, never unpickled."""

from __future__ import annotations

import numpy as np
import pytest

from stratoflow.training.recorded_outputs import FILE_NAME, RecordedOutputs
from stratoflow.training.slices import TestSlice


def tabular_record() -> RecordedOutputs:
    targets = np.array([0, 1, 2, 1], dtype="int64")
    return RecordedOutputs(
        outputs=np.arange(12, dtype="float32").reshape(4, 3),
        targets=targets,
        examples={
            "island": np.array([0, 2], dtype="int64"),
            "body_mass_g": np.array([3750.0, 4100.0], dtype="float32"),
        },
        slices=[
            TestSlice("class_1", "class 1 (Chinstrap)", targets == 1, 0.05),
            TestSlice("heavy", "body_mass_g in [4000, inf)", np.array([0, 1, 0, 0], bool), 0.1),
        ],
        versions={"tensorflow-cpu": "2.21.0", "keras": "3.15.1"},
    )


def test_a_record_reads_back_as_it_was_written(tmp_path):
    written = tabular_record()
    path = tmp_path / FILE_NAME
    written.save(path)
    read = RecordedOutputs.load(path)
    np.testing.assert_array_equal(read.outputs, written.outputs)
    np.testing.assert_array_equal(read.targets, written.targets)
    assert set(read.examples) == {"island", "body_mass_g"}
    assert read.examples["island"].dtype == np.int64  # a categorical column stays categorical
    np.testing.assert_array_equal(read.example_outputs(), written.outputs[:2])
    assert [(s.name, s.description, s.max_regression) for s in read.slices] == [
        ("class_1", "class 1 (Chinstrap)", 0.05),
        ("heavy", "body_mass_g in [4000, inf)", 0.1),
    ]
    np.testing.assert_array_equal(read.slices[1].mask, [False, True, False, False])
    assert read.requirements() == ["tensorflow-cpu==2.21.0", "keras==3.15.1"]
    assert [p.name for p in tmp_path.iterdir()] == [FILE_NAME]  # no partial file left


def test_an_image_record_without_slices_reads_back(tmp_path):
    images = np.random.default_rng(0).random((3, 8, 8, 1), dtype="float32")
    written = RecordedOutputs(np.ones((5, 10), "float32"), np.zeros(5, "int64"), images)
    written.save(tmp_path / FILE_NAME)
    read = RecordedOutputs.load(tmp_path / FILE_NAME)
    np.testing.assert_array_equal(read.examples, images)
    assert read.slices == [] and read.versions == {}
    assert read.example_outputs().shape == (3, 10)


def test_a_file_that_needs_unpickling_is_refused(tmp_path):
    """The file comes from a process that ran pipeline code: reading it must not run code."""
    path = tmp_path / FILE_NAME
    tabular_record().save(path)
    with np.load(path) as written:
        arrays = {key: written[key] for key in written.files}
    arrays["outputs"] = np.array([{"a": 1}], dtype=object)  # pickled inside the file
    with open(path, "wb") as stream:
        np.savez(stream, **arrays)
    with pytest.raises(ValueError, match="allow_pickle=False"):
        RecordedOutputs.load(path)


def test_a_training_task_that_recorded_nothing_says_what_to_do():
    with pytest.raises(FileNotFoundError, match="clear train_model and the tasks after it"):
        RecordedOutputs.load("")
