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
from stratoflow.config.parsing import SpecError
from stratoflow.config.spec import DatasetSpec, PipelineSpec, list_pipelines, load_spec


def dataset_asset(dataset: str) -> Any:
    """The `airflow.sdk.Asset` of TFDS dataset `dataset`."""
    from airflow.sdk import Asset

    return Asset(
        name=names.asset_name(dataset), uri=names.asset_uri(dataset), group=names.ASSET_GROUP
    )


def loadable_specs() -> list[PipelineSpec]:
    """The specs of the pipelines that load (those that do not have no DAGs either:
    `dags/pipeline_errors.py` reports them as its import error)."""
    specs = []
    for pipeline in list_pipelines():
        try:
            specs.append(load_spec(pipeline))
        except SpecError:
            continue
    return specs


def datasets_in_use() -> dict[str, list[tuple[DatasetSpec, str]]]:
    """TFDS dataset name -> the distinct (dataset spec, pipeline folder) the pipelines read.

    The folder is where a pipeline's own dataset code (`dataset.builder`) or image folder is.
    """
    used: dict[str, list[tuple[DatasetSpec, str]]] = {}
    for spec in loadable_specs():
        entries = used.setdefault(spec.dataset.name, [])
        # One folder per dataset spec: two copies of one builder (a pipeline copied with
        # `stratoflow new-pipeline --from`) prepare the same data, and TFDS registers a name once.
        if all(known != spec.dataset for known, _ in entries):
            entries.append((spec.dataset, spec.folder if _needs_folder(spec.dataset) else ""))
    return used


def pipelines_reading(dataset: str) -> list[str]:
    """The pipelines whose spec reads TFDS dataset `dataset`."""
    return [spec.name for spec in loadable_specs() if spec.dataset.name == dataset]


def _needs_folder(dataset: DatasetSpec) -> bool:
    relative_images = dataset.image_folder is not None and not dataset.image_folder.startswith("/")
    return dataset.builder is not None or dataset.preprocess is not None or relative_images
