"""A prepared split's records parsed and decoded in batches: TFDS's order, a fraction of its CPU.

TFDS's reader parses and decodes one `tf.train.Example` at a time (`tf.io.parse_single_example`
and a decode per feature: 200-300 µs of CPU per 12 KiB example, docs/BENCHMARKS.md). This one
reads the very records TFDS would, in the same order, and parses `READ_BATCH` of them with one
`tf.io.parse_example`, decoding each feature over the whole batch (raw tensor bytes with one
`tf.io.decode_raw`; other features with TFDS's own `decode_batch_example`).

The order is TFDS's `as_dataset` order for the same `tfds.ReadConfig`: the split's file
instructions (file, skip, take), sharded by `input_context`, shuffled with `shuffle_seed` when
`shuffle_files`, interleaved `interleave_cycle_length` files at a time, `interleave_block_length`
records from each in turn (read in `num_parallel_calls_for_interleave_files` threads, or by one
thread in turn when it is 1; deterministically either way). The test
`tests/unit/stratoflow/data/test_records.py` holds it to TFDS's values and order.

It reads TFRecord files of fixed-shape features (what stratoflow feeds a model: an image of a
fixed shape, or scalar columns, and a label); `supervised_examples` returns None for anything
else, and the caller reads it with TFDS's per-example reader instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tensorflow as tf

# Records parsed per `tf.io.parse_example`: past ~100 the per-call overhead is amortised.
READ_BATCH = 256


def supervised_examples(
    builder: Any,
    split: str,
    read_config: Any,
    shuffle_files: bool,
    convert: Callable[[Any, Any], tuple[Any, Any]] | None = None,
) -> tf.data.Dataset | None:
    """`builder.as_dataset(split, as_supervised=True, ...)`'s pairs, read `READ_BATCH` at a time.

    Args:
        builder: a prepared TFDS builder (`tfds.core.DatasetBuilder`).
        split: a split expression of it ("train", "train[:80%]", ...).
        read_config: the `tfds.ReadConfig` `as_dataset` would get, with an explicit
            `interleave_cycle_length`.
        shuffle_files: read the files in an order drawn from `read_config.shuffle_seed`.
        convert: an element-wise map of `(input, label)`, applied to each batch before it is
            split into examples (cheaper than per example; the same values).

    Returns:
        Unbatched `(input, label)` pairs: the same values in the same order as `as_dataset`
        gives them, and the same known length (`cardinality`; Keras `fit` differs without it)
        where it knows it. None when the dataset is not TFRecord files of fixed-shape features,
        or `read_config` asks for what this reader does not do (TFDS ids, a custom interleave
        order): read it with `as_dataset` then.
    """
    import tensorflow as tf
    import tensorflow_datasets as tfds

    info = builder.info
    file_format = getattr(info, "file_format", None)
    if file_format is not None and str(getattr(file_format, "value", file_format)) != "tfrecord":
        return None
    if not info.supervised_keys or len(info.supervised_keys) != 2:
        return None
    cycle_length = read_config.interleave_cycle_length
    block_length = read_config.interleave_block_length
    if not isinstance(cycle_length, int) or not isinstance(block_length, int):
        return None
    if read_config.add_tfds_id or read_config.experimental_interleave_sort_fn is not None:
        return None
    keys = tuple(info.supervised_keys)
    specs = {key: _parse_specs(key, info.features[key].get_serialized_info()) for key in keys}
    if any(spec is None for spec in specs.values()):
        return None
    flat_specs: dict[str, tuple[Any, Any]] = {}
    for spec in specs.values():
        assert spec is not None
        flat_specs.update(spec)

    instructions = info.splits[split].file_instructions
    files = tf.data.Dataset.from_tensor_slices(
        (
            [str(item.filename) for item in instructions],
            tf.constant([item.skip for item in instructions], tf.int64),
            tf.constant([item.take for item in instructions], tf.int64),
        )
    )
    context = read_config.input_context
    if context is not None:
        files = files.shard(context.num_input_pipelines, context.input_pipeline_id)
    if shuffle_files:
        files = files.shuffle(
            len(instructions),
            seed=read_config.shuffle_seed,
            reshuffle_each_iteration=read_config.shuffle_reshuffle_each_iteration,
        )
    buffer_size = read_config.override_buffer_size
    readers = read_config.num_parallel_calls_for_interleave_files

    def records_of(path: tf.Tensor, skip: tf.Tensor, take: tf.Tensor) -> tf.data.Dataset:
        return tf.data.TFRecordDataset(path, buffer_size=buffer_size).skip(skip).take(take)

    records = files.interleave(
        records_of,
        cycle_length=cycle_length,
        block_length=block_length,
        # One reader reads the files in turn itself; more read in threads of their own.
        num_parallel_calls=None if readers == 1 else readers,
        deterministic=True,
    )
    features = info.features

    def parse_and_decode(serialized: tf.Tensor) -> tuple[Any, Any]:
        parsed = tf.io.parse_example(
            serialized, {name: parse_spec for name, (parse_spec, _) in flat_specs.items()}
        )
        pair = []
        for key in keys:
            fields = {}
            for name, (_, tensor_info) in flat_specs.items():
                if name == key or name.startswith(f"{key}/"):
                    value = tf.reshape(parsed[name], [-1, *tensor_info.shape])
                    if value.dtype != tensor_info.tf_dtype:
                        value = tf.cast(value, tensor_info.tf_dtype)
                    fields[name[len(key) + 1 :]] = value
            serialized_value: Any = fields[""] if "" in fields else _nest(fields)
            pair.append(_decode_batch(features[key], serialized_value, tfds))
        return pair[0], pair[1]

    batches = records.batch(READ_BATCH).map(
        parse_and_decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )
    if convert is not None:
        batches = batches.map(convert, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    examples = batches.unbatch()
    # As TFDS does: a known length (Keras `fit` and `len()` use it), not when sharded by file.
    if read_config.assert_cardinality and context is None:
        total = sum(int(item.take) for item in instructions)
        examples = examples.apply(tf.data.experimental.assert_cardinality(total))
    return examples.with_options(read_config.options)


def _parse_specs(key: str, serialized_info: Any) -> dict[str, tuple[Any, Any]] | None:
    """`{flat name: (tf.io.FixedLenFeature, TensorInfo)}` of one feature, or None if any of its
    tensors has an unknown dimension (TFDS stores those as sequences: not read here)."""
    import tensorflow as tf

    flat: dict[str, Any] = {}

    def flatten(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for name, item in value.items():
                flatten(f"{prefix}/{name}", item)
        else:
            flat[prefix] = value

    flatten(key, serialized_info)
    specs: dict[str, tuple[Any, Any]] = {}
    for name, tensor_info in flat.items():
        shape = tuple(tensor_info.shape)
        dtype = tf.as_dtype(tensor_info.tf_dtype)
        if any(dim is None for dim in shape) or getattr(tensor_info, "sequence_rank", 0) > 1:
            return None
        # As TFDS writes them (its `example_serializer`): integers and bools as int64 lists,
        # floats as float lists, strings and encoded tensors as bytes lists.
        if dtype.is_integer or dtype.is_bool:
            stored = tf.int64
        elif dtype.is_floating:
            stored = tf.float32
        elif dtype == tf.string:
            stored = tf.string
        else:
            return None
        specs[name] = (
            tf.io.FixedLenFeature(shape, stored, default_value=tensor_info.default_value),
            tensor_info,
        )
    return specs


def _nest(fields: dict[str, Any]) -> dict[str, Any]:
    """`{"a/b": x}` → `{"a": {"b": x}}`: a FeaturesDict's serialized structure."""
    nested: dict[str, Any] = {}
    for name, value in fields.items():
        *parents, leaf = name.split("/")
        node = nested
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return nested


def _decode_batch(feature: Any, value: Any, tfds: Any) -> Any:
    """A batch of one feature decoded as TFDS decodes each example, in one op where it can."""
    import tensorflow as tf

    if isinstance(feature, tfds.features.FeaturesDict):
        return {name: _decode_batch(item, value[name], tfds) for name, item in feature.items()}
    # A fixed-shape tensor stored as its raw bytes (TFDS `Encoding.BYTES`): TFDS's batch decode
    # maps `decode_raw` over the examples one by one; every example has the same length, so one
    # `decode_raw` of the batch gives the same values. (`_encoding`: TFDS has no public name.)
    if (
        isinstance(feature, tfds.features.Tensor)
        and getattr(feature, "_encoding", None) == tfds.features.Encoding.BYTES
        and all(dim is not None for dim in feature.shape)
        and tf.as_dtype(feature.tf_dtype) not in (tf.uint64, tf.string)
    ):
        decoded = tf.io.decode_raw(value, feature.tf_dtype)
        return tf.reshape(decoded, [-1, *feature.shape])
    if isinstance(feature, tfds.features.Image):
        # Encoded images (PNG, JPEG) decode one at a time whatever the reader; TFDS's batch
        # decode does this same map but logs a deprecation warning (`FeatureConnector.dtype`).
        return tf.map_fn(feature.decode_example, value, fn_output_signature=feature.tf_dtype)
    return feature.decode_batch_example(value)
