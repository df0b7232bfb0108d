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

from stratoflow.config import names
from stratoflow.config.spec import DatasetSpec, list_pipelines, load_spec


def dataset_asset(dataset: str) -> Any:
    """The `airflow.sdk.Asset` of TFDS dataset `dataset`."""
    from airflow.sdk import Asset

    return Asset(
        name=names.asset_name(dataset), uri=names.asset_uri(dataset), group=names.ASSET_GROUP
    )


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
