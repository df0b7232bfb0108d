"""Building a spec's model: a name or an import path in a pipeline spec → an uncompiled Keras 3
model, checked.

The builders' contract, the bundled builders and the light checks of a builder name and its
hyperparameters are `stratoflow.config.model_builders` (resolving a run plan reads them at DAG
parse time); they are re-exported here, where pipeline code and tests have imported them. The
objective (`stratoflow.training.objectives`) adds the loss, the metrics and the optimizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from stratoflow.config.features import Features, Target
from stratoflow.config.model_builders import (
    CONTRACT_PARAMETERS,
    MODEL_BUILDERS,
    check_hyperparameters,
    has_random_layers,
    hyperparameter_names,
    mlp,
    resolve_builder,
    small_cnn,
    takes_statistics,
)
from stratoflow.config.parsing import SpecError

if TYPE_CHECKING:
    from stratoflow.config.spec import PipelineSpec
    from stratoflow.data.datasets import DatasetRef
    from stratoflow.data.statistics import SplitStatistics

__all__ = [
    "CONTRACT_PARAMETERS",
    "MODEL_BUILDERS",
    "build_model",
    "build_pipeline_model",
    "check_hyperparameters",
    "has_random_layers",
    "hyperparameter_names",
    "mlp",
    "resolve_builder",
    "small_cnn",
    "takes_statistics",
]


def build_pipeline_model(
    spec: PipelineSpec, dataset: DatasetRef, statistics: SplitStatistics | None = None
) -> Any:
    """`spec`'s model for `dataset`'s features and target (see `build_model`).

    A builder that takes `statistics` gets `statistics` (the training split's), computed here
    from the prepared split when None (a streamed pass: a process without the run's file).
    """
    function = resolve_builder(spec.model.builder, spec.folder or None)
    if statistics is None and takes_statistics(function):
        from stratoflow.data.profiling import dataset_statistics

        statistics = dataset_statistics(dataset, roles=["train"]).train
    return build_model(
        spec.model.builder,
        dataset.features,
        dataset.target,
        spec.model.hyperparameters,
        spec.folder or None,
        statistics=statistics,
    )


def build_model(
    builder: str,
    features: Features,
    target: Target,
    hyperparameters: dict[str, Any],
    folder: str | Path | None = None,
    *,
    statistics: SplitStatistics | None = None,
) -> Any:
    """Build the model `builder` names; check what it returns.

    Args:
        builder: a bundled builder's name or an import path `module:function`.
        features: the dataset's features.
        target: the dataset's target.
        hyperparameters: the spec's `model.hyperparameters`.
        folder: the pipeline folder (for an import path).
        statistics: the training split's statistics, for a builder that takes `statistics`.

    Raises:
        SpecError: the builder does not resolve, a hyperparameter it does not take, the builder
            raised, or it returned something else than a Keras model.
    """
    import keras

    function = resolve_builder(builder, folder)
    check_hyperparameters(function, hyperparameters, builder, "model")
    extra: dict[str, Any] = {}
    if takes_statistics(function):
        if statistics is None:
            raise SpecError(
                f"model.builder {builder!r} takes statistics, and none were given to build it"
            )
        extra["statistics"] = statistics
    try:
        model = function(features, target, **hyperparameters, **extra)
    except Exception as error:
        raise SpecError(
            f"model.builder {builder!r} raised {type(error).__name__}: {error}"
        ) from error
    if not isinstance(model, keras.Model):
        raise SpecError(
            f"model.builder {builder!r} returned {type(model).__name__}, not a keras.Model "
            "(Keras 3: `import keras`, not tf_keras)"
        )
    return model
