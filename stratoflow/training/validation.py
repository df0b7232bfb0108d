"""The one validation of a pipeline and of a run's configuration, before any work starts.

`load_pipeline` is a spec plus what depends on its model: a known builder, and a default
strategy that can train it. `resolve_run` is the configuration one DAG run trains with: the
spec's defaults, the run's Params (checked against the Params' own schemas, with Airflow's
messages), and the combinations a schema cannot express. The DAG files call `load_pipeline`
at parse time; `stratoflow run` calls `resolve_run` before Airflow starts; the first task of a
run calls it once and hands the result to the tasks after it.

Light: no TensorFlow, Keras or MLflow (the model builders import Keras only when called).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from stratoflow.config import clusters
from stratoflow.config.parsing import SpecError
from stratoflow.config.spec import PipelineSpec, load_spec
from stratoflow.config.strategies import STRATEGIES
from stratoflow.config.training import resolve_training
from stratoflow.training.models import MODEL_BUILDERS, check_hyperparameters, has_random_layers

if TYPE_CHECKING:
    from stratoflow.data.datasets import DatasetRef


def load_pipeline(name: str) -> PipelineSpec:
    """The validated spec of pipeline `name`, its model checked too.

    Raises:
        SpecError: no such pipeline, or an invalid key, value or model (named in the message).
    """
    spec = load_spec(name)
    check_model(spec, f"{spec.source}: training")
    return spec


def resolve_run(pipeline: str, conf: Mapping[str, Any]) -> PipelineSpec:
    """Pipeline `pipeline` with a run's Params applied to its training defaults, validated.

    A run that names no cluster gets the deployment's cluster `default` where it needs one
    (`stratoflow.config.clusters`): a Ray cluster for launcher `ray`, and a standing cluster,
    if the deployment has one, for a local `parameter_server` run.

    Args:
        pipeline: a pipeline name.
        conf: the run's Params (a DAG run's `conf`, or `stratoflow run`'s flags).

    Raises:
        SpecError: an unknown Param, or an invalid value or combination (named in the message).
    """
    spec = load_pipeline(pipeline)
    training = resolve_training(spec.training, conf)
    if (
        STRATEGIES[training.strategy].standing_cluster
        and training.launcher == "local"
        and not training.cluster
        and clusters.DEFAULT in clusters.standing_clusters()
    ):
        training = dataclasses.replace(training, cluster=clusters.DEFAULT)
    if training.launcher == "ray" and not training.ray_cluster:
        configured = clusters.ray_clusters()
        if clusters.DEFAULT not in configured:
            raise SpecError(
                "run conf.ray_cluster: launcher 'ray' needs a Ray cluster of this deployment and "
                "it has no cluster 'default'; name one of: "
                f"{', '.join(sorted(configured)) or f'none (set ${clusters.RAY_CLUSTERS_ENV})'}"
            )
        training = dataclasses.replace(training, ray_cluster=clusters.DEFAULT)
    # A spec's own default names a cluster too: it must be one of this deployment's.
    if training.cluster:
        clusters.standing_cluster(training.cluster)
    if training.ray_cluster:
        clusters.ray_address(training.ray_cluster)
    result = dataclasses.replace(spec, training=training)
    check_model(result, "run conf")
    return result


def check_model(spec: PipelineSpec, where: str = "training") -> None:
    """Refuse an unknown model builder, and a strategy that cannot train the model (no Keras).

    `central_storage` fails on layers that draw random numbers; a bundled builder has Dropout
    exactly when its `dropout` hyperparameter is non-zero (`models.has_random_layers`).
    """
    builder = spec.model.builder
    if ":" not in builder and builder not in MODEL_BUILDERS:
        raise SpecError(
            f"{where.rsplit(':', 1)[0]}: model.builder {builder!r} is not a known model builder; "
            f"allowed: {', '.join(sorted(MODEL_BUILDERS))}, or an import path 'module:function'"
        )
    if ":" not in builder:  # a bundled builder's signature needs no import of the pipeline's code
        check_hyperparameters(
            MODEL_BUILDERS[builder],
            spec.model.hyperparameters,
            builder,
            where.rsplit(":", 1)[0] + ": model",
        )
    if STRATEGIES[spec.training.strategy].refuses_random_layers and has_random_layers(
        builder, spec.model.hyperparameters
    ):
        raise SpecError(
            f"{where}.strategy {spec.training.strategy!r} cannot train model {builder!r}: it "
            f"has Dropout (model.hyperparameters.dropout "
            f"{spec.model.hyperparameters.get('dropout')}), and TensorFlow's CentralStorage fails "
            "on layers that draw random numbers; choose another strategy, e.g. 'mirrored'"
        )


def check_pipeline_code(spec: PipelineSpec, dataset: DatasetRef) -> None:
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
    from stratoflow.training import objectives
    from stratoflow.training.models import build_pipeline_model

    source = spec.source
    try:
        objectives.make_optimizer(spec.optimizer, spec.training.learning_rate)
    except (TypeError, ValueError) as error:
        raise SpecError(f"{source}: optimizer: {error}") from None
    try:
        model = build_pipeline_model(spec, dataset)
    except SpecError as error:
        raise SpecError(f"{source}: {error}") from None
    try:
        inputs, targets = next(iter(load_split(dataset, "train").batch(2)))
    except SpecError as error:
        raise SpecError(f"{source}: {error}") from None
    except (tf.errors.OpError, TypeError, ValueError) as error:
        raise SpecError(
            f"{source}: dataset.preprocess {spec.dataset.preprocess!r} failed on the training "
            f"examples: {type(error).__name__}: {' '.join(str(error).split())[:600]}"
        ) from None
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


def _describe_inputs(inputs: Any) -> str:
    if isinstance(inputs, dict):
        return ", ".join(
            f"{key} {value.dtype.name}{list(value.shape)}" for key, value in inputs.items()
        )
    return f"{inputs.dtype.name}{list(inputs.shape)}"
