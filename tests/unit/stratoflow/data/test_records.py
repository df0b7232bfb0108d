"""The batched reader (`stratoflow.data.records`) against TFDS's per-example one, on real files.

`load_split` parses and decodes a prepared split's records in batches; `per_example=True` reads
them through TFDS's `as_dataset`, one record at a time, as before. Both must give the same pairs
(every value, exactly) in the same order: in a split's fixed order, and in a streamed epoch's
order (files shuffled by a seed, several read in turns, sharded by file across workers). Data:
`stratoflow_generated/tiny` (raw float32 bytes, 4 files), the bundled digits and mnist (PNG
images) and penguins (a dict of tabular columns, a pipeline's preprocessing function).
"""

from __future__ import annotations

import numpy as np
import pytest

from stratoflow.config.spec import DatasetSpec, load_spec


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tf_runtime):
    from benchmarks.generated_data import NAME, build
    from stratoflow.data.datasets import prepare_dataset

    data_dir = tmp_path_factory.mktemp("generated")
    build(str(data_dir), "tiny", shards=4)
    return prepare_dataset(DatasetSpec(NAME, "1.0.0", "tiny"), data_dir)


def pairs(dataset) -> tuple[int, list]:
    """An unbatched dataset's known length (`cardinality`: Keras `fit` reads it) and every
    `(features, target)` of it, as numpy values, in order."""
    return int(dataset.cardinality()), list(dataset.as_numpy_iterator())


def assert_same_pairs(batched_read: tuple[int, list], per_example_read: tuple[int, list]) -> None:
    (cardinality, batched), (expected_cardinality, per_example) = batched_read, per_example_read
    assert cardinality == expected_cardinality
    assert len(batched) == len(per_example) > 0
    for index, ((x, y), (x_ref, y_ref)) in enumerate(zip(batched, per_example, strict=True)):
        if isinstance(x_ref, dict):
            assert sorted(x) == sorted(x_ref), index
            for name in x_ref:
                assert x[name].dtype == x_ref[name].dtype, (index, name)
                np.testing.assert_array_equal(x[name], x_ref[name], err_msg=f"{index} {name}")
        else:
            assert x.dtype == x_ref.dtype and x.shape == x_ref.shape, index
            np.testing.assert_array_equal(x, x_ref, err_msg=str(index))
        assert y.dtype == y_ref.dtype, index
        np.testing.assert_array_equal(y, y_ref, err_msg=str(index))


def streamed_read_config(seed: int, cycle_length: int, context=None, readers=None):
    """A streamed epoch's read config, as `TrainingInput` streams a split (`readers`: threads
    reading the files; None: as `TrainingInput` reads them)."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    from stratoflow.data.input_pipeline import FILE_READERS

    options = tf.data.Options()
    options.deterministic = True
    return tfds.ReadConfig(
        options=options,
        shuffle_seed=seed,
        shuffle_reshuffle_each_iteration=False,
        interleave_cycle_length=cycle_length,
        interleave_block_length=1,
        num_parallel_calls_for_interleave_files=FILE_READERS if readers is None else readers,
        input_context=context,
        enable_ordering_guard=False,
        try_autocache=False,
    )


def test_the_batched_reader_parses_records_in_batches(tiny):
    """What makes it fast: one `ParseExample` per batch of records instead of one
    `ParseExampleV2`... per record (`parse_single_example`) in TFDS's own reader."""
    import tensorflow as tf

    from stratoflow.data.datasets import load_split

    def parse_ops(dataset) -> list[str]:
        graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
        nodes = [*graph.node, *(node for f in graph.library.function for node in f.node_def)]
        return [node.op for node in nodes if "Parse" in node.op or "Batch" in node.op]

    batched = parse_ops(load_split(tiny, "train"))
    assert "ParseExampleV2" in batched and "BatchDatasetV2" in batched, batched
    assert "ParseSingleExample" not in batched
    assert "BatchDatasetV2" not in parse_ops(load_split(tiny, "train", per_example=True))


@pytest.mark.parametrize("role", ["train", "validation", "test"])
def test_a_split_in_its_fixed_order_gives_the_same_pairs_as_tfds(tiny, role):
    from stratoflow.data.datasets import load_split

    assert_same_pairs(
        pairs(load_split(tiny, role)), pairs(load_split(tiny, role, per_example=True))
    )


@pytest.mark.parametrize("readers", [None, -1], ids=["as-streamed", "parallel"])
@pytest.mark.parametrize("seed", [7, 8])
@pytest.mark.parametrize("cycle_length", [1, 3])
def test_a_streamed_epoch_reads_the_same_pairs_in_the_same_order_as_tfds(
    tiny, seed, cycle_length, readers
):
    from stratoflow.data.datasets import load_split

    def read(per_example: bool) -> list:
        config = streamed_read_config(seed, cycle_length, readers=readers)
        return pairs(
            load_split(
                tiny, "train", read_config=config, shuffle_files=True, per_example=per_example
            )
        )

    batched = read(False)
    assert_same_pairs(batched, read(True))
    # The order is the files' shuffled one, not the split's: the seed reaches the reader.
    ids = [int(round(x.flat[0] / x.flat[1])) for x, _ in batched[1]]
    assert sorted(ids) == list(range(400)) and ids != list(range(400))


def test_each_worker_reads_the_same_files_as_tfds_would_give_it(tiny):
    import tensorflow as tf

    from stratoflow.data.datasets import load_split

    for index in range(3):
        context = tf.distribute.InputContext(3, index, 3)

        def read(per_example: bool, context=context) -> list:
            config = streamed_read_config(7, 2, context)
            return pairs(
                load_split(
                    tiny, "train", read_config=config, shuffle_files=True, per_example=per_example
                )
            )

        assert_same_pairs(read(False), read(True))


@pytest.mark.parametrize(("pipeline", "role"), [("digits", "train"), ("mnist", "test")])
def test_bundled_image_pipelines_read_the_same_pairs_as_with_tfds(pipeline, role, tf_runtime):
    """PNG images, decoded by TFDS's batch decode; mnist's test split is a sub-split."""
    from stratoflow.data.datasets import load_split, prepare_dataset

    ref = prepare_dataset(load_spec(pipeline).dataset)
    assert_same_pairs(pairs(load_split(ref, role)), pairs(load_split(ref, role, per_example=True)))


PREPROCESS = """
import tensorflow as tf


def shift(features, target):
    # The contract (docs/reference/pipeline-code.md): one example at a time, never a batch.
    if target.shape.rank != 0 or any(value.shape.rank != 0 for value in features.values()):
        raise ValueError(f"preprocess got a batch: {target.shape}")
    return {**features, "bill_length_mm": features["bill_length_mm"] + 1000.0}, target
"""


def test_tabular_columns_and_the_pipelines_preprocessing_per_example(tmp_path, tf_runtime):
    """penguins: a dict of float and categorical columns; a `preprocess` function that refuses a
    batch still gets single examples, and its output is the same through either reader."""
    from stratoflow.data.datasets import load_split, prepare_dataset

    spec = load_spec("penguins")
    ref = prepare_dataset(spec.dataset, folder=spec.folder or None)
    (tmp_path / "prep.py").write_text(PREPROCESS)
    ref.preprocess, ref.pipeline_folder = "prep:shift", str(tmp_path)
    batched = pairs(load_split(ref, "train"))
    assert_same_pairs(batched, pairs(load_split(ref, "train", per_example=True)))
    assert min(x["bill_length_mm"] for x, _ in batched[1]) > 1000.0
