"""What keys a passed own-code check: the spec, the pipeline's and the engine's code, the prepared
dataset's files; any change is a miss. No TensorFlow here: the dataset is a folder of files as
TFDS leaves it, the check's result a dict (the first task's use of it, a child not started
again and an edited model refused again, is in `test_own_code_check.py`)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from stratoflow.config import locations
from stratoflow.config.spec import load_spec
from stratoflow.training import own_code_cache
from tests.unit.stratoflow.training.test_own_code_check import write_pipeline

RESULT = {"dataset": {"name": "stratoflow_digits", "built": False}, "statistics": {"train": {}}}


@pytest.fixture
def pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pipeline `mine` on a prepared stratoflow_digits 1.0.0 (two files), state in tmp."""
    monkeypatch.setenv("STRATOFLOW_PIPELINES_PATH", str(tmp_path / "pipelines"))
    monkeypatch.setenv(locations.DATA_DIR_ENV, str(tmp_path / "data"))
    monkeypatch.setenv(locations.STATE_DIR_ENV, str(tmp_path / "state"))
    variant = tmp_path / "data" / "stratoflow_digits" / "1.0.0"
    variant.mkdir(parents=True)
    (variant / "dataset_info.json").write_text("{}")
    (variant / "stratoflow_digits-train.tfrecord-00000-of-00001").write_bytes(b"records")
    return write_pipeline(tmp_path / "pipelines", "mine")


def test_a_passed_check_is_recalled_under_the_same_key(pipeline: Path) -> None:
    key = own_code_cache.cache_key(load_spec("mine"))
    assert key is not None
    assert own_code_cache.recall(key) is None
    own_code_cache.remember(key, RESULT)
    assert own_code_cache.cache_key(load_spec("mine")) == key
    assert own_code_cache.recall(key) == RESULT
    # The fingerprint's own cache file, written beside the data by the check, changes nothing.
    (pipeline.parent.parent / "data" / "stratoflow_digits" / "1.0.0" / ".stratoflow-x").touch()
    assert own_code_cache.cache_key(load_spec("mine")) == key


def test_the_pipelines_code_the_spec_and_the_data_each_change_the_key(pipeline: Path) -> None:
    key = own_code_cache.cache_key(load_spec("mine"))
    own_code_cache.remember(str(key), RESULT)

    model = pipeline / "model.py"
    model.write_text(model.read_text() + "\n# edited\n")
    edited_code = own_code_cache.cache_key(load_spec("mine"))

    spec = load_spec("mine")
    other_seed = dataclasses.replace(
        spec, training=dataclasses.replace(spec.training, seed=spec.training.seed + 1)
    )
    edited_spec = own_code_cache.cache_key(other_seed)

    shard = pipeline.parent.parent / "data" / "stratoflow_digits" / "1.0.0"
    shard /= "stratoflow_digits-train.tfrecord-00000-of-00001"
    shard.write_bytes(b"other records")  # rebuilt: another size and modification time
    os.utime(shard, ns=(1, 1))
    rebuilt = own_code_cache.cache_key(load_spec("mine"))

    keys = [key, edited_code, edited_spec, rebuilt]
    assert None not in keys
    assert len(set(keys)) == 4, keys
    assert all(own_code_cache.recall(str(k)) is None for k in keys[1:])


def test_no_key_for_data_not_prepared_or_read_in_place(
    pipeline: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = load_spec("mine")
    monkeypatch.setenv(locations.DATA_DIR_ENV, str(tmp_path / "empty-data-dir"))
    assert own_code_cache.cache_key(spec) is None  # not prepared: the check prepares it
    in_place = dataclasses.replace(
        spec, dataset=dataclasses.replace(spec.dataset, image_folder="images")
    )
    assert own_code_cache.cache_key(in_place) is None  # its images are not hashed


def test_an_unreadable_or_foreign_entry_is_a_miss(pipeline: Path) -> None:
    key = str(own_code_cache.cache_key(load_spec("mine")))
    entry = locations.state_dir() / own_code_cache.FOLDER / f"{key}.json"
    entry.parent.mkdir(parents=True)
    entry.write_text("not json")
    assert own_code_cache.recall(key) is None
    entry.write_text('{"scheme": "own-code-check/0", "result": {}}')
    assert own_code_cache.recall(key) is None
