"""The Airflow asset of each dataset: a refresh DAG produces it, the retrain DAGs consume it.

A dataset's asset is named after its TFDS name (`stratoflow_digits`) with the URI
`x-tfds://stratoflow_digits` (Airflow's `x-` prefix marks a scheme of our own). When the dataset
is refreshed (the DAG `refresh_<dataset>` succeeds, or anyone posts an event for the asset
through the REST API), every pipeline reading that dataset retrains, on top of its cron.

The names are plain strings here; `dataset_asset` builds the `airflow.sdk.Asset` and is the only
function that imports Airflow (inside), so this module stays light.
"""

from __future__ import annotations

from typing import Any

from pipelines.spec import DatasetSpec, list_pipelines, load_spec

ASSET_GROUP = "tfds"
URI_SCHEME = "x-tfds"
REFRESH_DAG_PREFIX = "refresh_"


def asset_name(dataset: str) -> str:
    """The asset name of TFDS dataset `dataset`: the dataset name itself."""
    return dataset


def asset_uri(dataset: str) -> str:
    """The asset URI of TFDS dataset `dataset`, e.g. `x-tfds://stratoflow_digits`."""
    return f"{URI_SCHEME}://{dataset}"


def refresh_dag_id(dataset: str) -> str:
    """The DAG refreshing `dataset` and emitting its asset event: `refresh_stratoflow_digits`."""
    return f"{REFRESH_DAG_PREFIX}{dataset}"


def dataset_asset(dataset: str) -> Any:
    """The `airflow.sdk.Asset` of TFDS dataset `dataset`."""
    from airflow.sdk import Asset

    return Asset(name=asset_name(dataset), uri=asset_uri(dataset), group=ASSET_GROUP)


def datasets_in_use() -> dict[str, list[DatasetSpec]]:
    """TFDS dataset name -> the distinct dataset specs (versions, configs) the pipelines read."""
    used: dict[str, list[DatasetSpec]] = {}
    for pipeline in list_pipelines():
        spec = load_spec(pipeline).dataset
        if spec not in used.setdefault(spec.name, []):
            used[spec.name].append(spec)
    return used


def pipelines_reading(dataset: str) -> list[str]:
    """The pipelines whose spec reads TFDS dataset `dataset`."""
    return [name for name in list_pipelines() if load_spec(name).dataset.name == dataset]
