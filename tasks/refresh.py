"""The refresh DAG's task: prepare every version of one dataset the pipelines read.

The refresh DAG (`stratoflow/dags/refresh_datasets.py`) calls `refresh_dataset` and emits the
dataset's asset event with its result as the event's extra, which retrains every pipeline reading
it.
"""

from __future__ import annotations

from dataclasses import dataclass

from stratoflow.config import names
from stratoflow.tasks.run_context import XComResult


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
class RefreshedDataset(XComResult):
    """What `refresh_dataset` found or built: the asset event's extra and the task's XCom.

    Attributes:
        dataset: the TFDS dataset name.
        versions: version (`config:version` for a builder config) → what is prepared there.
    """

    dataset: str
    versions: dict[str, PreparedVersion]

    PRODUCER = names.REFRESH_TASK


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
    for spec, folder in specs[dataset]:
        reference = datasets.prepare_dataset(spec, folder=folder or None)
        key = reference.version if spec.config is None else f"{spec.config}:{reference.version}"
        versions[key] = PreparedVersion(
            fingerprint=reference.fingerprint,
            built=reference.built,
            split_sizes=dict(reference.split_sizes),
        )
    return RefreshedDataset(dataset=dataset, versions=versions)
