"""The refresh DAG's task: prepare every version of one dataset the pipelines read.

The refresh DAG (`dags/refresh_datasets.py`) calls `refresh_dataset` and emits the dataset's
asset event with its result as the event's extra, which retrains every pipeline reading it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stratoflow.config import names
from tasks.run_context import checked_fields, typed


@dataclass(frozen=True)
class PreparedVersion:
    """One prepared version of a dataset.

    Attributes:
        fingerprint: the content fingerprint (tells a consumer what data it got).
        built: True if this refresh built it, False if it was prepared already.
        split_sizes: role (train / validation / test) → number of examples.
    """

    fingerprint: str
    built: bool
    split_sizes: dict[str, int]


@dataclass(frozen=True)
class RefreshedDataset:
    """What `refresh_dataset` found or built: the asset event's extra and the task's XCom.

    Attributes:
        dataset: the TFDS dataset name.
        versions: version (`config:version` for a builder config) → what is prepared there.
    """

    dataset: str
    versions: dict[str, PreparedVersion]

    def to_dict(self) -> dict[str, Any]:
        """`{"dataset": name, "versions": {version: {"fingerprint", "built", "split_sizes"}}}`."""
        return {
            "dataset": self.dataset,
            "versions": {
                key: {
                    "fingerprint": version.fingerprint,
                    "built": version.built,
                    "split_sizes": dict(version.split_sizes),
                }
                for key, version in self.versions.items()
            },
        }

    @classmethod
    def from_dict(cls, data: Any) -> RefreshedDataset:
        """Rebuild it from `to_dict()` output (an XCom, or an asset event's extra).

        Raises:
            PayloadError: a key is missing or unknown, or a value has the wrong type (named).
        """
        what = f"the result of {names.REFRESH_TASK}"
        values = checked_fields(cls, data, what)
        versions = {}
        for key, version in typed(values["versions"], dict, "versions", what).items():
            where = f"{what}: versions.{key}"
            fields = checked_fields(PreparedVersion, version, where)
            versions[str(key)] = PreparedVersion(
                fingerprint=typed(fields["fingerprint"], str, "fingerprint", where),
                built=typed(fields["built"], bool, "built", where),
                split_sizes={
                    str(role): typed(size, int, f"split_sizes.{role}", where)
                    for role, size in typed(
                        fields["split_sizes"], dict, "split_sizes", where
                    ).items()
                },
            )
        return cls(dataset=typed(values["dataset"], str, "dataset", what), versions=versions)


def refresh_dataset(dataset: str) -> RefreshedDataset:
    """Prepare every version of TFDS dataset `dataset` the pipelines read; describe what is there.

    A version that is not prepared yet is built; one that is, is checked and fingerprinted.

    Raises:
        KeyError: no pipeline reads `dataset`.
    """
    from stratoflow.config.assets import datasets_in_use
    from stratoflow.data import datasets

    specs = datasets_in_use()
    if dataset not in specs:
        raise KeyError(
            f"no pipeline reads dataset {dataset!r}; datasets in use: {', '.join(sorted(specs))}"
        )
    versions = {}
    for spec in specs[dataset]:
        reference = datasets.prepare_dataset(spec)
        key = reference.version if spec.config is None else f"{spec.config}:{reference.version}"
        versions[key] = PreparedVersion(
            fingerprint=reference.fingerprint,
            built=reference.built,
            split_sizes=dict(reference.split_sizes),
        )
    return RefreshedDataset(dataset=dataset, versions=versions)
