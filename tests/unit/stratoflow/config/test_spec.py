"""Pipeline specs: the shipped ones load, and every kind of mistake names its field."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import yaml

from stratoflow.config.options import LOOPS, REPLICA_CHOICES
from stratoflow.config.params import dag_params
from stratoflow.config.parsing import SpecError
from stratoflow.config.run_plan import check_model, load_pipeline, resolve_plan
from stratoflow.config.spec import SPECS_DIR, list_pipelines, load_spec, parse_spec
from stratoflow.config.strategies import STRATEGIES
from stratoflow.config.training import TrainingConfig, resolve_training


def _mnist_data() -> dict[str, Any]:
    return yaml.safe_load((SPECS_DIR / "mnist" / "pipeline.yaml").read_text())


def _with(path: str, value: Any) -> dict[str, Any]:
    """The mnist spec's mapping with `path` ("training.strategy") set to `value`."""
    data = copy.deepcopy(_mnist_data())
    *parents, key = path.split(".")
    node = data
    for parent in parents:
        node = node.setdefault(parent, {})
    node[key] = value
    return data


def test_the_shipped_pipelines() -> None:
    assert list_pipelines() == ["diabetes", "digits", "mnist", "penguins"]


@pytest.mark.parametrize("name", ["mnist", "digits"])
def test_shipped_specs_load(name: str) -> None:
    spec = load_spec(name)
    assert spec.name == name
    assert spec.dataset.name == {"mnist": "stratoflow_mnist5k", "digits": "stratoflow_digits"}[name]
    assert spec.schedule
    assert spec.registered_model.startswith("stratoflow-")
    assert set(spec.dataset.splits) >= {"train", "validation", "test"}


def test_spec_values_are_read_from_the_file() -> None:
    mnist = load_spec("mnist")
    assert mnist.training.epochs == 8
    assert mnist.training.learning_rate == 0.002
    assert mnist.retry_delay_seconds == 30
    digits = load_spec("digits")
    # Unset training keys fall back to TrainingConfig's defaults.
    assert digits.training.strategy == TrainingConfig().strategy
    assert digits.training.batch_size == 32


def test_an_edited_pipeline_file_is_read_again_and_broken_yaml_is_named(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One DAG parse reads each file several times, parsed once per text: an edit is a new text.
    folder = tmp_path / "mine"
    folder.mkdir()
    spec_file = folder / "pipeline.yaml"
    spec_file.write_text((SPECS_DIR / "mnist" / "pipeline.yaml").read_text())
    monkeypatch.setenv("STRATOFLOW_PIPELINES_PATH", str(folder))
    first = load_spec("mine")
    assert first.training.epochs == 8
    assert load_spec("mine") == first  # unchanged by whatever the first load did to its data
    spec_file.write_text(spec_file.read_text().replace("epochs: 8", "epochs: 3", 1))
    assert load_spec("mine").training.epochs == 3
    spec_file.write_text("training: {epochs: 3\n")
    with pytest.raises(SpecError, match=r"mine/pipeline\.yaml: not readable YAML: .*line 1"):
        load_spec("mine")


def test_unknown_pipeline_lists_the_available_ones() -> None:
    listed = r"unknown pipeline 'nope'; available: diabetes, digits, mnist, penguins"
    with pytest.raises(SpecError, match=listed):
        load_spec("nope")


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("trainig", {"epochs": 1}, r"unknown key 'trainig'"),
        ("training.epoch", 3, r"training: unknown key 'epoch'"),
        ("training.epochs", "five", r"training\.epochs: expected int, got str 'five'"),
        ("training.epochs", True, r"training\.epochs: expected int, got bool"),
        ("training.promote", "yes", r"training\.promote: expected bool"),
        ("retries", 1.5, r"retries: expected int, got float"),
        ("tags", "mnist", r"tags: expected a list"),
        ("training.strategy", "bogus", r"training\.strategy 'bogus' is not allowed; allowed: auto"),
        ("training.loop", "keras", r"training\.loop 'keras' is not allowed; allowed: custom, fit"),
        ("training.replicas", 3, r"training\.replicas 3 is not allowed; allowed: 1, 2, 4, 8"),
        ("training.epochs", 0, r"training\.epochs must be >= 1"),
        ("training.learning_rate", 0, r"training\.learning_rate must be within \(0, 1\]"),
        # The single-metric spelling (mnist's own spec lists its metrics: see
        # test_evaluation_spec.py for that spelling's mistakes).
        ("evaluation", {"metric": "test_accuracy", "min": 1.5}, r"evaluation\.min must be within"),
        ("evaluation", {"min": float("nan")}, r"evaluation\.min: expected a finite"),
        (
            "evaluation",
            {"min": 0.9, "max_regression": float("inf")},
            r"max_regression: expected a finite number",
        ),
        ("dataset.splits", {"train": "train"}, r"dataset\.splits lacks test, validation"),
    ],
)
def test_invalid_spec_names_the_field(path: str, value: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec("mnist", _with(path, value), source="mnist.yaml")


def test_missing_required_key_is_named() -> None:
    data = _mnist_data()
    del data["registered_model"]
    with pytest.raises(SpecError, match=r"missing required key 'registered_model'"):
        parse_spec("mnist", data, source="mnist.yaml")


def test_batch_must_split_evenly_across_mirrored_replicas() -> None:
    data = _with("training.strategy", "mirrored")
    data["training"].update(replicas=4, batch_size=66)
    with pytest.raises(SpecError, match=r"training\.batch_size 66 must be divisible by replicas 4"):
        parse_spec("mnist", data, source="mnist.yaml")
    data["training"]["batch_size"] = 64
    assert parse_spec("mnist", data).training.replicas == 4


@pytest.mark.parametrize(
    "strategy", [name for name, traits in STRATEGIES.items() if "fit" not in traits.loops]
)
def test_fit_with_a_strategy_keras_cannot_fit_is_refused(strategy: str) -> None:
    with pytest.raises(
        SpecError, match=r"loop 'fit' does not work with strategy .*use loop 'custom'"
    ):
        resolve_training(TrainingConfig(), {"loop": "fit", "strategy": strategy})


def test_workers_and_ps_are_checked() -> None:
    with pytest.raises(SpecError, match=r"param workers: 7 is not one of \[1, 2, 3, 4\]"):
        resolve_training(TrainingConfig(), {"workers": 7})
    with pytest.raises(SpecError, match=r"param ps: 3 is not one of \[1, 2\]"):
        resolve_training(TrainingConfig(), {"ps": 3})
    with pytest.raises(SpecError, match=r"batch_size 63 must be divisible by workers 2"):
        resolve_training(TrainingConfig(), {"strategy": "multi_worker_mirrored", "batch_size": 63})


def test_override_training_applies_the_run_params() -> None:
    defaults = load_spec("mnist").training
    overridden = resolve_training(
        defaults,
        {"strategy": "mirrored", "replicas": 2, "epochs": 1, "learning_rate": 1, "promote": False},
    )
    assert overridden == dataclasses.replace(
        defaults, strategy="mirrored", replicas=2, epochs=1, learning_rate=1.0, promote=False
    )
    assert repr(overridden.learning_rate) == "1.0"  # coerced to the field's type, not kept an int
    assert resolve_training(defaults, {}) == defaults


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"strategy": "bogus"}, r"param strategy: 'bogus' is not one of \['auto', 'one_device'"),
        ({"optimizer": "sgd"}, r"run conf: unknown key 'optimizer'"),
        ({"epochs": "2"}, r"param epochs: '2' is not of type 'integer'"),
        ({"strategy": "mirrored", "replicas": 4, "batch_size": 10}, r"divisible by replicas 4"),
    ],
)
def test_override_training_refuses_bad_overrides(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        resolve_training(load_spec("mnist").training, overrides)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_refused_naming_the_field(value: float) -> None:
    with pytest.raises(SpecError, match=r"Invalid input for param learning_rate: "):
        resolve_training(TrainingConfig(), {"learning_rate": value})


def test_central_storage_is_refused_from_the_spec_when_the_model_has_dropout() -> None:
    with pytest.raises(
        SpecError,
        match=r"run conf\.strategy 'central_storage' cannot train model 'mlp': it has Dropout "
        r"\(model\.hyperparameters\.dropout 0\.1\)",
    ):
        resolve_plan("digits", {"strategy": "central_storage"})  # mlp with dropout 0.1
    digits = load_spec("digits")
    no_dropout = dataclasses.replace(
        digits,
        model=dataclasses.replace(digits.model, hyperparameters={"dropout": 0.0}),
        training=dataclasses.replace(digits.training, strategy="central_storage"),
    )
    check_model(no_dropout)  # accepted
    assert resolve_plan("mnist", {"strategy": "central_storage"}).spec  # dropout 0.0
    spec_file = _with("training.strategy", "central_storage")
    spec_file["model"]["hyperparameters"]["dropout"] = 0.2
    with pytest.raises(SpecError, match=r"mnist\.yaml: training\.strategy 'central_storage'"):
        check_model(parse_spec("mnist", spec_file), "mnist.yaml: training")


def test_an_unknown_model_builder_is_named_with_the_known_ones() -> None:
    spec = parse_spec("mnist", _with("model.builder", "resnet9000"))
    with pytest.raises(
        SpecError, match=r"mnist\.yaml: model\.builder 'resnet9000' is not a known model builder"
    ):
        check_model(spec, "mnist.yaml: training")
    assert load_pipeline("mnist") == load_spec("mnist")


@pytest.mark.parametrize("name", ["mnist", "digits"])
def test_dag_params_cover_every_training_setting(name: str) -> None:
    spec = load_spec(name)
    params = dag_params(spec)
    assert list(params) == [f.name for f in dataclasses.fields(TrainingConfig)]
    for key, kwargs in params.items():
        assert kwargs["description"], key
    # The defaults sent back as a run's conf (the UI's form sends them all) give the spec's config.
    defaults = {key: kwargs["default"] for key, kwargs in params.items()}
    assert resolve_training(spec.training, defaults) == spec.training
    assert params["strategy"]["enum"] == list(STRATEGIES)
    assert params["loop"]["enum"] == list(LOOPS)
    assert params["replicas"]["enum"] == list(REPLICA_CHOICES)


def test_a_bundled_builders_unknown_hyperparameter_is_refused_with_the_dag() -> None:
    spec = parse_spec(
        "mnist", _with("model.hyperparameters.filter", [8]), source="/p/pipeline.yaml"
    )
    with pytest.raises(
        SpecError,
        match=r"^/p/pipeline\.yaml: model\.hyperparameters: 'filter' is not a hyperparameter of "
        r"'small_cnn'; allowed: filters, dense_units, dropout$",
    ):
        check_model(spec, "/p/pipeline.yaml: training")
