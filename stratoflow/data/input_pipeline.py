"""The training input: a split is cached in memory when it fits the budget, else streamed.

`load_split` reads a prepared split in a fixed order; this module decides how training reads it:

- **The estimate** (`plan_split`): the split's examples times the decoded bytes of its first
  example, as `load_split` yields it (what `.cache()` would hold), from the prepared dataset.
- **Cached** when the estimate fits the budget (`TrainingConfig.cache_budget_mb`): the split is
  read once, kept in memory, and each epoch is a full permutation of it (seed `seed + epoch`).
  The custom loop reads its epochs back to back from one dataset (`TrainingInput.epochs`), so
  the next epoch's permutation is drawn while this one's last steps train.
- **Streamed** otherwise: each epoch reads the split's files again, in an order drawn from
  `seed + epoch`, `INTERLEAVE_FILES` files at a time (`FILE_READERS` threads), one example from
  each in turn, through a shuffle buffer holding at most `1 / SHUFFLE_BUFFER_SHARE` of the
  budget. Same seed, same batches; but an example can only move as far as the buffer lets it,
  so an epoch is not a full permutation of the split.
- **Several input pipelines** (multi-worker mirrored: one per worker): a cached split is sharded
  by DATA (tf.data's auto-shard: every worker reads it, keeps its share). A streamed split is
  sharded by FILE when it has at least as many files as input pipelines (each worker reads only
  its own files), else by DATA. Every worker's input repeats, so no worker runs out before the
  epoch's `examples // batch_size` steps when the files hold unequal counts.
- **Parameter server**: each worker builds its input itself, without an index to shard by
  (`ClusterCoordinator.create_per_worker_dataset`), so each reads the whole split, cached or
  streamed by the same rule, in an order drawn from its own clock.

TensorFlow and TFDS are imported inside the functions: importing this module is cheap.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stratoflow.data.datasets import DatasetRef, load_split

if TYPE_CHECKING:
    import tensorflow as tf

logger = logging.getLogger(__name__)

MIB = 2**20
# Files read at once by a streamed split (fewer when the split or the worker has fewer).
INTERLEAVE_FILES = 4
# A streamed split's shuffle buffer holds at most this fraction (1/N) of the budget's bytes.
SHUFFLE_BUFFER_SHARE = 4
# Threads reading a streamed split's files (its `INTERLEAVE_FILES` in turn). One: a thread per
# file cost ~4 µs of CPU per 12 KiB example in hand-offs and read no faster from local disk, and
# the training's steps use every core (docs/BENCHMARKS.md, "Streamed input").
FILE_READERS = 1


@dataclass(frozen=True)
class SplitPlan:
    """How training reads one split: its size estimate and whether it is cached.

    Attributes:
        role: "train", "validation", ...
        examples: examples in the split.
        example_bytes: decoded bytes of the split's first example (every tensor of it).
        files: the prepared files the split reads (none for an image folder).
        budget_bytes: the memory this split was allowed.
        cached: True when `estimated_bytes <= budget_bytes`.
        image_folder: for an image folder, the split folder whose class folders it reads.
    """

    role: str
    examples: int
    example_bytes: int
    files: int
    budget_bytes: int
    cached: bool
    image_folder: str | None = None

    @property
    def estimated_bytes(self) -> int:
        """The decoded size of the whole split: examples x bytes of the first example."""
        return self.examples * self.example_bytes

    @property
    def source(self) -> str:
        """What the split is read from: its prepared files, or an image folder's split folder."""
        if self.image_folder is not None:
            return f"the images in {self.image_folder}"
        return f"{self.files} file{'' if self.files == 1 else 's'}"

    def describe(self) -> str:
        """One log line: the estimate against the budget and the decision."""
        verdict = "cached in memory" if self.cached else "streamed from its files"
        return (
            f"{self.role} split: {self.examples:,} examples x {self.example_bytes:,} B = "
            f"{self.estimated_bytes / MIB:,.1f} MiB decoded, from {self.source}, budget "
            f"{self.budget_bytes / MIB:,.1f} MiB: {verdict}"
        )


def plan_split(ref: DatasetRef | Mapping[str, Any], role: str, budget_bytes: int) -> SplitPlan:
    """Decide whether `role` is cached (its estimate fits `budget_bytes`) or streamed.

    Args:
        ref: the prepared dataset.
        role: the split's role.
        budget_bytes: the memory the split may take, in bytes.
    """
    ref = ref if isinstance(ref, DatasetRef) else DatasetRef.from_dict(ref)
    examples = int(ref.split_sizes[role])
    size = example_bytes(ref, role)
    return SplitPlan(
        role=role,
        examples=examples,
        example_bytes=size,
        files=len(split_files(ref, role)),
        budget_bytes=budget_bytes,
        cached=examples * size <= budget_bytes,
        image_folder=None
        if ref.image_folder is None
        else str(Path(ref.image_folder) / ref.splits[role]),
    )


def example_bytes(ref: DatasetRef, role: str) -> int:
    """Decoded bytes of the first example of `role`: every tensor of its `(x, y)` structure."""
    import tensorflow as tf

    element = next(iter(load_split(ref, role).take(1)))
    total = 0
    for tensor in tf.nest.flatten(element):
        value = tensor.numpy()
        if value.dtype == object:  # strings: their bytes
            total += sum(len(item) for item in value.reshape(-1))
        else:
            total += int(value.nbytes)
    return total


def split_files(ref: DatasetRef, role: str) -> list[str]:
    """The prepared files `role` reads, in the split's order (none for an image folder).

    An image folder is read image by image from its class folders, not from prepared record
    files: it has nothing to shard by file, so it is sharded by DATA.
    """
    import tensorflow_datasets as tfds

    if ref.image_folder is not None:
        return []
    variant = Path(ref.data_dir) / ref.name
    if ref.config:
        variant /= ref.config
    info = tfds.builder_from_directory(str(variant / ref.version)).info
    return [str(item.filename) for item in info.splits[ref.splits[role]].file_instructions]


class TrainingInput:
    """The training split's batches, epoch by epoch, cached or streamed (see the module doc).

    Call it with an epoch for that epoch's global batches (one input pipeline: one_device,
    mirrored, Keras `fit`, a parameter-server worker); `distribute` gives a strategy's
    distributed dataset, sharded across input pipelines by the module's rule.
    """

    def __init__(
        self,
        ref: DatasetRef,
        batch_size: int,
        seed: int,
        budget_bytes: int,
        remote: bool = False,
    ):
        """Plan the split and, when it is cached and read here, set up its cache.

        Args:
            ref: the prepared dataset.
            batch_size: the global batch; a partial last batch is dropped.
            seed: the run's seed.
            budget_bytes: the memory the training split may take.
            remote: parameter-server input, built by each worker itself.
        """
        self.ref = ref
        self.batch_size = batch_size
        self.seed = seed
        self.remote = remote
        self.plan = plan_split(ref, "train", budget_bytes)
        buffer_bytes = budget_bytes // SHUFFLE_BUFFER_SHARE
        self.shuffle_buffer = min(
            self.plan.examples, max(batch_size, buffer_bytes // max(1, self.plan.example_bytes))
        )
        logger.info(
            "%s%s",
            self.plan.describe(),
            "" if self.plan.cached else f"; shuffle buffer {self.shuffle_buffer:,} examples",
        )
        # A parameter-server worker builds its input itself: a dataset made here cannot be
        # shipped to it ("Unable to parse tensor proto").
        self._cached = load_split(ref, "train").cache() if self.plan.cached and not remote else None

    @property
    def epochs_run_on(self) -> bool:
        """Whether `epochs` gives several epochs as one dataset (a cached split read here)."""
        return self._cached is not None

    def epochs(self, first: int, last: int | None = None) -> tf.data.Dataset:
        """Epochs `first` to `last` (None: on and on), back to back, from one input pipeline.

        The same batches as `self(first)`, `self(first + 1)`, ... (each epoch drawn from the same
        seed), but one iterator runs on into the next epoch while this one ends. A cached epoch
        begins by filling a shuffle buffer with the whole split: 24-48 ms at the first step of a
        62-step mnist epoch (5-8 % of it), the training waiting; 0.5 ms here, filled meanwhile.

        Raises:
            ValueError: the split is not cached here (`epochs_run_on` is False): a streamed split's
                epochs are read one dataset each.
        """
        import tensorflow as tf

        if not self.epochs_run_on:
            raise ValueError(f"only a cached split's epochs run on; this {self.plan.describe()}")
        end = 2**31 - 1 if last is None else last + 1
        return (
            tf.data.Dataset.range(first, end)
            .flat_map(self._cached_epoch)
            .with_options(_shard_by_data())
            .prefetch(tf.data.AUTOTUNE)
        )

    def _cached_epoch(self, epoch: tf.Tensor) -> tf.data.Dataset:
        """A cached epoch's batches: a full permutation of the split, drawn from `seed + epoch`."""
        import tensorflow as tf

        assert self._cached is not None
        seed = tf.cast(epoch, tf.int64) + self.seed
        return self._cached.shuffle(
            self.plan.examples, seed=seed, reshuffle_each_iteration=False
        ).batch(self.batch_size, drop_remainder=True)  # a partial batch crashes MKL

    def __call__(self, epoch: int) -> tf.data.Dataset:
        """Epoch `epoch`'s global batches, from one input pipeline."""
        import tensorflow as tf

        epoch_seed: Any = self.seed + epoch
        if self.remote:
            # Every PS worker runs this same function with no worker index, so a fixed seed
            # would give them identical batch orders (each batch trained twice, half the split
            # never): draw each worker's order from its own clock instead.
            epoch_seed = tf.cast(tf.timestamp() * 1e6, tf.int64) % (2**31 - 1)
        if self.plan.cached:
            examples = self._cached if self._cached is not None else load_split(self.ref, "train")
            if self.remote:
                examples = examples.cache()
            # A full permutation of the split (the batches `epochs` gives for this epoch).
            examples = examples.shuffle(
                self.plan.examples, seed=epoch_seed, reshuffle_each_iteration=False
            )
        else:
            examples = self._stream(epoch_seed, None).shuffle(
                self.shuffle_buffer, seed=epoch_seed, reshuffle_each_iteration=False
            )
        return (
            examples.batch(self.batch_size, drop_remainder=True)  # a partial batch crashes MKL
            .with_options(_shard_by_data())
            .prefetch(tf.data.AUTOTUNE)
        )

    def distribute(self, strategy: Any, epoch: int) -> Any:
        """Epoch `epoch` as `strategy`'s distributed dataset, sharded by the module's rule."""
        if self.plan.cached:
            return strategy.experimental_distribute_dataset(self(epoch))
        return strategy.distribute_datasets_from_function(
            lambda context: self.for_input_pipeline(epoch, context)
        )

    def shards_by_file(self, input_pipelines: int) -> bool:
        """Whether a streamed split is sharded by FILE across `input_pipelines` pipelines."""
        return not self.plan.cached and input_pipelines > 1 and self.plan.files >= input_pipelines

    def for_input_pipeline(
        self, epoch: int, context: tf.distribute.InputContext
    ) -> tf.data.Dataset:
        """A streamed epoch as input pipeline `context.input_pipeline_id` reads it.

        Its share of the split (its own files, or every N-th example), shuffled, batched per
        replica, repeated (see the module doc).
        """
        import tensorflow as tf

        pipelines, index = context.num_input_pipelines, context.input_pipeline_id
        by_file = self.shards_by_file(pipelines)
        examples = self._stream(self.seed + epoch, context if by_file else None)
        if pipelines > 1 and not by_file:
            examples = examples.shard(pipelines, index)
        if epoch == 1 or pipelines > 1:
            logger.info(
                "input pipeline %d of %d: %s",
                index + 1,
                pipelines,
                f"its own files of the {self.plan.files} (sharded by FILE)"
                if by_file
                else f"one example in {pipelines} of {self.plan.source} (sharded by DATA)"
                if pipelines > 1
                else "the whole split",
            )
        return (
            examples.shuffle(
                self.shuffle_buffer, seed=self.seed + epoch, reshuffle_each_iteration=False
            )
            .repeat()
            .batch(context.get_per_replica_batch_size(self.batch_size), drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE)
        )

    def _stream(self, seed: Any, context: Any) -> tf.data.Dataset:
        """The split's examples read from its files in an order drawn from `seed`."""
        import tensorflow as tf
        import tensorflow_datasets as tfds

        options = tf.data.Options()
        options.deterministic = True
        files = self.plan.files
        if context is not None:
            files = -(-files // context.num_input_pipelines)
        read_config = tfds.ReadConfig(
            options=options,
            shuffle_seed=seed,
            shuffle_reshuffle_each_iteration=False,
            interleave_cycle_length=max(1, min(INTERLEAVE_FILES, files)),
            interleave_block_length=1,
            num_parallel_calls_for_interleave_files=FILE_READERS,
            input_context=context,
            # An ordered dataset (`disable_shuffling`) is fine to read out of order for training.
            enable_ordering_guard=False,
            # TFDS would cache a small dataset in memory by itself: streaming means not caching.
            try_autocache=False,
        )
        return load_split(self.ref, "train", read_config=read_config, shuffle_files=True)


def validation_batches(
    ref: DatasetRef, batch_size: int, budget_bytes: int
) -> tuple[tf.data.Dataset, SplitPlan]:
    """The validation split in batches, in its fixed order: cached if it fits `budget_bytes`.

    Returns:
        The batches and the split's plan.
    """
    import tensorflow as tf

    plan = plan_split(ref, "validation", budget_bytes)
    logger.info("%s", plan.describe())
    examples = load_split(ref, "validation")
    if plan.cached:
        examples = examples.cache()
    return examples.batch(batch_size).prefetch(tf.data.AUTOTUNE), plan


def _shard_by_data() -> tf.data.Options:
    import tensorflow as tf

    options = tf.data.Options()
    # Explicit: AUTO falls back silently, OFF duplicates examples across workers
    # (docs/BENCHMARKS.md, "Facts").
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return options
