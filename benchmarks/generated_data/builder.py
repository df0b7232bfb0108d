"""`stratoflow_generated`: a TFDS dataset of generated examples, as large as a benchmark needs.

The larger-than-memory case of `make bench` (`benchmarks/run.py`) and the input pipeline's tests
(`tests/unit/stratoflow/data/test_input_pipeline.py`) build it into a temporary data dir. TFDS
needs a `GeneratorBasedBuilder` to live in a package, hence this one. Two configs:

- `bench`: 32x32x3 float32 examples in 0..255 (12 KiB each once decoded), 46,000 training
  examples (539 MiB decoded: more than 4x the 128 MiB cache budget the benchmark trains with);
- `tiny`: a 2x2x1 float32 "image" of the values `[i, 1, 2, 3]` for example `i`, 400 training
  examples, so a test can tell which example (and so which file) it read whatever scaling the
  input applies: `i = x.flat[0] / x.flat[1]`.

Both are images (height, width, channels): what `prepare_dataset` takes as image features.

Both are ordered (`disable_shuffling`): example `i` of a split sits in file `i // per_file`.
Labels are `i % 10`. `python -m benchmarks.generated_data DATA_DIR CONFIG [SHARDS]` builds one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

logger = logging.getLogger(__name__)

NAME = "stratoflow_generated"
_CHUNK = 1000


@dataclasses.dataclass
class GeneratedConfig(tfds.core.BuilderConfig):
    """How many examples of which shape each split holds."""

    shape: tuple[int, ...] = (2, 2, 1)
    split_sizes: tuple[tuple[str, int], ...] = ()
    indexed: bool = False


class StratoflowGenerated(tfds.core.GeneratorBasedBuilder):
    """Generated examples (random or indexed), labels `i % 10`; see the module docstring."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    BUILDER_CONFIGS = [
        GeneratedConfig(
            name="bench",
            description="32x32x3 float32 noise in 0..255, 46,000 / 1,000 / 1,000 examples.",
            shape=(32, 32, 3),
            split_sizes=(("train", 46_000), ("validation", 1_000), ("test", 1_000)),
        ),
        GeneratedConfig(
            name="tiny",
            description="[i, 1, 2, 3] as a 2x2x1 image for example i, 400 / 40 / 40 examples.",
            shape=(2, 2, 1),
            split_sizes=(("train", 400), ("validation", 40), ("test", 40)),
            indexed=True,
        ),
    ]

    def _info(self) -> tfds.core.DatasetInfo:
        config = self.builder_config
        assert isinstance(config, GeneratedConfig)
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict(
                {
                    "x": tfds.features.Tensor(
                        shape=config.shape,
                        dtype=np.float32,
                        # Raw bytes: encoding float lists is ~10x slower to write.
                        encoding=tfds.features.Encoding.BYTES,
                    ),
                    "label": tfds.features.ClassLabel(num_classes=10),
                }
            ),
            supervised_keys=("x", "label"),
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[tuple[int, Any]]]:
        config = self.builder_config
        assert isinstance(config, GeneratedConfig)
        return {
            split: self._generate_examples(split, size, seed)
            for seed, (split, size) in enumerate(config.split_sizes)
        }

    def _generate_examples(self, split: str, size: int, seed: int) -> Iterator[tuple[int, Any]]:
        config = self.builder_config
        assert isinstance(config, GeneratedConfig)
        rng = np.random.default_rng(seed)
        for start in range(0, size, _CHUNK):
            count = min(_CHUNK, size - start)
            if config.indexed:
                flat = np.tile(np.arange(4, dtype=np.float32), (count, 1))
                flat[:, 0] = np.arange(start, start + count)
                flat[:, 1] = 1.0
                values = flat.reshape(count, *config.shape)
            else:
                values = rng.uniform(0, 255, (count, *config.shape)).astype(np.float32)
            for offset in range(count):
                index = start + offset
                yield index, {"x": values[offset], "label": index % 10}


def build(data_dir: str, config: str, shards: int | None = None) -> None:
    """Write config `config` into `data_dir` (`shards` files per split; None: TFDS decides)."""
    builder = StratoflowGenerated(config=config, data_dir=data_dir)
    if builder.is_prepared():
        return
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(
            num_shards=shards, compute_stats=tfds.download.ComputeStatsMode.SKIP
        )
    )
