"""The check of a pipeline's own code against its prepared data, in the run's first task.

A run's configuration is resolved and validated once, without TensorFlow, by
`stratoflow.config.run_plan`; what needs the pipeline's own code imported and run (its model
builder, its preprocessing, its optimizer arguments) is checked here, in the child process of
`stratoflow.training.own_code_check`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stratoflow.config.parsing import SpecError

if TYPE_CHECKING:
    from stratoflow.config.spec import PipelineSpec
    from stratoflow.data.datasets import DatasetRef
    from stratoflow.data.statistics import SplitStatistics


def check_pipeline_code(
    spec: PipelineSpec, dataset: DatasetRef, statistics: SplitStatistics | None = None
) -> None:
    """Check the pipeline's own code against its prepared data, before any training.

    Imports the model builder and the preprocessing function (never done at DAG parse time),
    checks the hyperparameter names against the builder's signature and the optimizer's
    arguments against the Keras optimizer, builds the model and runs it on two training examples:
    a builder that raises or returns no Keras model, features the model cannot take, or outputs
    that do not fit the target fail here, in the run's first task, without a retry.

    Raises:
        SpecError: naming the pipeline file and the field.
    """
    import keras
    import tensorflow as tf

    from stratoflow.data.datasets import load_split
    from stratoflow.training import objectives, slices
    from stratoflow.training.models import build_pipeline_model

    source = spec.source
    # The gate's feature slices name the dataset's columns and values: refused before training.
    slices.check_feature_slices(spec.evaluation.slices, dataset.features, source)
    try:
        objectives.make_optimizer(spec.optimizer, spec.training.learning_rate)
    except (TypeError, ValueError) as error:
        raise SpecError(f"{source}: optimizer: {error}") from None
    try:
        model = build_pipeline_model(spec, dataset, statistics)
    except SpecError as error:
        raise SpecError(f"{source}: {error}") from None
    try:
        inputs, targets = next(iter(load_split(dataset, "train").batch(2)))
    except SpecError as error:
        raise SpecError(f"{source}: {error}") from None
    except (tf.errors.OpError, TypeError, ValueError) as error:
        raise preprocessing_refusal(spec, error) from None
    try:
        outputs = model(inputs, training=False)
    except Exception as error:
        raise SpecError(
            f"{source}: model.builder {spec.model.builder!r}: the model cannot take the "
            f"dataset's features ({dataset.features.kind}: "
            f"{_describe_inputs(inputs)}): {type(error).__name__}: "
            f"{' '.join(str(error).split())[:600]}"
        ) from None
    expected = (int(targets.shape[0]), dataset.target.num_outputs)
    if not isinstance(outputs, tf.Tensor | keras.KerasTensor) and not hasattr(outputs, "shape"):
        raise SpecError(
            f"{source}: model.builder {spec.model.builder!r}: the model returns "
            f"{type(outputs).__name__}; it must return one tensor of shape (batch, outputs)"
        )
    if tuple(outputs.shape) != expected:
        raise SpecError(
            f"{source}: model.builder {spec.model.builder!r}: the model outputs shape "
            f"{tuple(outputs.shape)} for {expected[0]} examples; the {dataset.target.task} "
            f"target needs ({expected[0]}, {expected[1]}): "
            + (
                "one logit per class"
                if dataset.target.task == "classification"
                else "one value per regression target"
            )
        )


def preprocessing_refusal(spec: PipelineSpec, error: Exception) -> SpecError:
    """The refusal of a preprocessing function that failed on the training examples."""
    return SpecError(
        f"{spec.source}: dataset.preprocess {spec.dataset.preprocess!r} failed on the training "
        f"examples: {type(error).__name__}: {' '.join(str(error).split())[:600]}"
    )


def _describe_inputs(inputs: Any) -> str:
    if isinstance(inputs, dict):
        return ", ".join(
            f"{key} {value.dtype.name}{list(value.shape)}" for key, value in inputs.items()
        )
    return f"{inputs.dtype.name}{list(inputs.shape)}"
