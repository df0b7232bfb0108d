"""The training input's memory policy (`stratoflow.data.input_pipeline`), on real prepared files.

A split whose decoded examples exceed the cache budget is streamed from its TFRecord files (no
cache anywhere in its tf.data graph), one at or under it is cached; a streamed split is sharded by
FILE across input pipelines when it has enough files. The data is `stratoflow_generated/tiny`
(benchmarks/generated_data): 400 training examples in 4 files, example `i` = `[i, 1, 2, 3]` as a
2x2x1 image, written in order, so an example tells which file it came from (`i // 100`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from stratoflow.config.spec import DatasetSpec, ModelSpec, load_spec

FILES = 4
PER_FILE = 100
BATCH = 16


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    from benchmarks.generated_data import NAME, build
    from stratoflow.data.datasets import prepare_dataset

    data_dir = tmp_path_factory.mktemp("generated")
    build(str(data_dir), "tiny", shards=FILES)
    return prepare_dataset(DatasetSpec(NAME, "1.0.0", "tiny"), data_dir)


def example_ids(dataset) -> list[int]:
    """The index `i` of every example of a batched dataset, in order (scaling-proof)."""
    ids: list[int] = []
    for x, _ in dataset.as_numpy_iterator():
        flat = x.reshape(len(x), -1)
        ids.extend(np.rint(flat[:, 0] / flat[:, 1]).astype(int).tolist())
    return ids


def dataset_nodes(dataset) -> list:
    """Every node of a tf.data dataset's graph, nested functions (map, interleave) included."""
    import tensorflow as tf

    graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    return [*graph.node, *(node for f in graph.library.function for node in f.node_def)]


def dataset_ops(dataset) -> set[str]:
    """Every op of a tf.data dataset's graph, nested functions included."""
    return {node.op for node in dataset_nodes(dataset)}


def cache_nodes(dataset) -> int:
    """How many caches a tf.data dataset's graph holds."""
    return sum(node.op.startswith("CacheDataset") for node in dataset_nodes(dataset))


def test_reading_a_few_examples_of_a_split_fills_no_cache(generated):
    """What the own-code check (two examples) and the size estimate (one) read: a split with no
    cache in it, so taking a few examples leaves no half-filled cache behind (TensorFlow's
    "did not fully read the dataset being cached" warning, once per read)."""
    from stratoflow.data.datasets import load_split

    assert cache_nodes(load_split(generated, "train").take(2)) == 0


def test_a_split_over_the_budget_is_streamed_and_one_within_it_is_cached(generated):
    from stratoflow.data.input_pipeline import TrainingInput

    estimate = TrainingInput(generated, BATCH, seed=7, budget_bytes=0).plan.estimated_bytes
    # x: 2x2x1 float32, label: int64 (the split's first example, decoded), for 400 examples.
    assert estimate == 400 * (4 * 4 + 8)

    streamed = TrainingInput(generated, BATCH, seed=7, budget_bytes=estimate - 1)
    assert not streamed.plan.cached and streamed.plan.files == FILES
    ops = dataset_ops(streamed(1))
    assert "TFRecordDataset" in ops
    assert not any(op.startswith("CacheDataset") for op in ops), sorted(ops)
    first = example_ids(streamed(1))
    # Every example once per epoch; same seed and epoch, same batches; another epoch, another order.
    assert len(first) == 400 // BATCH * BATCH and len(set(first)) == len(first)
    assert example_ids(streamed(1)) == first
    assert example_ids(streamed(2)) != first
    assert example_ids(TrainingInput(generated, BATCH, 7, estimate - 1)(1)) == first

    cached = TrainingInput(generated, BATCH, seed=7, budget_bytes=estimate)
    assert cached.plan.cached
    # One copy in memory, the one the budget counts: TFDS does not cache the split by itself too.
    assert cache_nodes(cached(1)) == 1
    epoch = example_ids(cached(1))
    assert len(set(epoch)) == len(epoch) == 400 // BATCH * BATCH
    assert epoch == example_ids(cached(1)) != example_ids(cached(2))


def test_a_cached_splits_epochs_run_on_in_one_dataset_with_the_same_batches(generated):
    """What the custom loop iterates (`CustomLoopEpoch`): epoch after epoch in one iterator, so
    the next epoch's shuffle buffer fills while this one ends; the batches are each epoch's own,
    in order, and the dataset ends after the last epoch asked for (nothing read beyond it)."""
    from stratoflow.data.input_pipeline import TrainingInput

    cached = TrainingInput(generated, BATCH, seed=7, budget_bytes=2**20)
    assert cached.epochs_run_on
    # One copy of the split in memory for all the epochs, as for one.
    assert cache_nodes(cached.epochs(1, 3)) == 1
    steps = 400 // BATCH
    run_on = example_ids(cached.epochs(2, 4))
    assert len(run_on) == 3 * steps * BATCH
    each = [example_ids(cached(epoch)) for epoch in (2, 3, 4)]
    assert run_on == [i for epoch in each for i in epoch]
    assert each[0] != each[1] != each[2]
    # Open-ended (the benchmarks): the same epochs first.
    assert example_ids(cached.epochs(2).take(steps)) == each[0]

    streamed = TrainingInput(generated, BATCH, seed=7, budget_bytes=0)
    assert not streamed.epochs_run_on
    with pytest.raises(ValueError, match="only a cached split's epochs run on"):
        streamed.epochs(1, 2)


def test_workers_read_distinct_files_when_the_split_has_enough(generated):
    import tensorflow as tf

    from stratoflow.data.input_pipeline import TrainingInput

    # 3 workers for 4 files: a FILE shard is files {0, 3}, {1}, {2} in some order. (With 2
    # workers, DATA sharding of files read in turn would pick whole files too, by coincidence.)
    streamed = TrainingInput(generated, 3 * 8, seed=7, budget_bytes=0)  # 8 examples per replica
    assert streamed.shards_by_file(3)
    files_read = []
    for index in range(3):
        context = tf.distribute.InputContext(3, index, 3)
        # Its first 96 examples (the smallest share is one file, 100 examples).
        ids = example_ids(streamed.for_input_pipeline(1, context).take(12))
        assert len(set(ids)) == len(ids) == 96
        files_read.append({i // PER_FILE for i in ids})
    assert sorted(len(files) for files in files_read) == [1, 1, 2], files_read
    assert set().union(*files_read) == set(range(FILES))

    # More workers than files: every worker reads every file and keeps its share (DATA).
    five = TrainingInput(generated, 5 * 4, seed=7, budget_bytes=0)  # 4 examples per replica
    assert not five.shards_by_file(5) and five.plan.files < 5
    shares = [
        set(example_ids(five.for_input_pipeline(1, tf.distribute.InputContext(5, i, 5)).take(20)))
        for i in range(5)
    ]
    assert all(len(share) == 80 for share in shares)
    assert all(a.isdisjoint(b) for a in shares for b in shares if a is not b)
    # Each share spans the files (every 5th example), unlike a FILE shard.
    assert all({i // PER_FILE for i in share} == set(range(FILES)) for share in shares)


def test_a_streamed_split_trains_the_same_under_one_device_and_mirrored(tmp_path):
    from stratoflow.data.datasets import prepare_dataset
    from stratoflow.training.trainer import train

    spec = load_spec("digits")
    digits = prepare_dataset(spec.dataset)

    def run(strategy: str, folder: str):
        training = dataclasses.replace(
            spec.training,
            strategy=strategy,
            epochs=2,
            batch_size=64,
            learning_rate=0.01,
            seed=7,
            cache_budget_mb=0,  # always stream
        )
        model = ModelSpec("mlp", {"hidden_units": [64], "dropout": 0.0})
        return train(
            dataclasses.replace(spec, model=model, training=training), digits, tmp_path / folder
        )

    # (Same seed, same batches: the first test checks it on the input itself.)
    one_device, mirrored = run("one_device", "a"), run("mirrored", "b")
    losses = [[entry["loss"] for entry in result.history] for result in (one_device, mirrored)]
    assert losses[0][-1] < losses[0][0] and one_device.history[-1]["val_accuracy"] > 0.8
    # Mirrored's replicas take consecutive per-replica batches: the same global batches.
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    assert Path(mirrored.model_path).is_file()
